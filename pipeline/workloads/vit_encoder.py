"""A ViT-style encoder for image classification, inference: `own_model.py --workload
pipeline/workloads/vit_encoder.py:vit`.

Torch only, random weights, nothing downloaded. Patch embedding by a strided convolution, a
class token and learned positions, `depth` pre-norm encoder blocks (LayerNorm, multi-head
self-attention through `torch.nn.functional.scaled_dot_product_attention`, LayerNorm, GELU
MLP of `mlp` x width) and a linear head on the class token. The model is built directly on
the device in the run's dtype (`with torch.device(...)`), as large models are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp * width), nn.GELU(), nn.Linear(mlp * width, width)
        )

    def forward(self, x):
        batch, tokens, width = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attention = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self, image, patch, width, depth, heads, mlp, classes) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, width, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, width))
        self.blocks = nn.ModuleList(Block(width, heads, mlp) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, images):
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def vit(config, *, image=32, patch=4, width=64, depth=2, heads=4, mlp=4, classes=10):
    """Inference on `batch` random images; width must be a multiple of heads."""
    with torch.device(config.device):
        model = Encoder(image, patch, width, depth, heads, mlp, classes).to(config.dtype)

    def make_inputs():
        shape = (config.batch, 3, image, image)
        return torch.randn(shape, device=config.device, dtype=config.dtype)

    return Workload(model=model.eval(), make_inputs=make_inputs)
