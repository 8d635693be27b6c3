"""One AdamW training step of a small decoder-only language model: `own_model.py --workload
pipeline/workloads/decoder_training.py:decoder_adamw`.

Self-contained, torch only, random weights, nothing downloaded: token embedding, `layers`
blocks (RMSNorm, rotary positions, grouped-query causal attention through
`scaled_dot_product_attention(enable_gqa=True)`, SwiGLU MLP of `ffn` channels), final
RMSNorm and an untied LM head. It is written here rather than imported from the pipeline's
decoder workload so that the example stands alone, as a user's file would.

The step returns the loss (next-token cross-entropy on random tokens); the harness runs
`loss.backward()` and `optimizer.step()` itself, so the first optimizer step, which creates
AdamW's two moments per parameter, is a phase of its own (`optimizer_state`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    def __init__(self, width, heads, kv_heads, ffn) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, width // heads
        self.norm1 = RMSNorm(width)
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.norm2 = RMSNorm(width)
        self.gate_up = nn.Linear(width, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def forward(self, x, cos, sin):
        batch, tokens, width = x.shape
        h = self.norm1(x)
        q = self.q(h).view(batch, tokens, self.heads, self.head).transpose(1, 2)
        kv = self.kv(h).view(batch, tokens, 2, self.kv_heads, self.head)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(attention.transpose(1, 2).reshape(batch, tokens, width))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Decoder(nn.Module):
    def __init__(self, vocab, context, width, layers, heads, kv_heads, ffn) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        half = width // heads // 2
        frequencies = 1.0 / 10000 ** (torch.arange(half, dtype=torch.float32) / half)
        angles = torch.outer(torch.arange(context, dtype=torch.float32), frequencies)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        cos = self.cos[: tokens.shape[1]].to(x.dtype)
        sin = self.sin[: tokens.shape[1]].to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def decoder_adamw(
    config, *, vocab=256, context=64, width=64, layers=2, heads=4, kv_heads=2, ffn=172
):
    """AdamW on next-token prediction; width a multiple of heads, heads of kv_heads."""
    model = Decoder(vocab, context, width, layers, heads, kv_heads, ffn)
    model = model.to(device=config.device, dtype=config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def make_inputs():
        shape = (config.batch, context + 1)
        tokens = torch.randint(0, vocab, shape, device=config.device)
        return tokens[:, :-1], tokens[:, 1:]

    def step(model, inputs):
        tokens, targets = inputs
        logits = model(tokens)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)
