"""A sentence encoder built from torch.nn's own Transformer modules (embedding, a stack of
nn.TransformerEncoderLayer with batch_first=True, a classifier on the first token), the
shape of a BERT-base encoder: `own_model.py --workload
pipeline/workloads/nn_encoder.py:encoder_inference` (the forward in evaluation mode, under
inference mode, where PyTorch runs each layer as one fused kernel: its inference fast path)
or `:encoder_training` (one AdamW step on a classification, the general path).

Torch only, random weights, nothing downloaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class Encoder(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, labels: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.classify = nn.Linear(width, labels)

    def forward(self, words):  # (batch, tokens)
        return self.classify(self.encoder(self.embed(words))[:, 0])


def encoder_inference(config, *, vocab=30522, width=768, heads=12, layers=12, tokens=128):
    """The forward over `tokens` words, in evaluation mode."""
    model = Encoder(vocab, width, heads, layers, 2)
    model = model.to(device=config.device, dtype=config.dtype).eval()
    shape = (config.batch, tokens)
    return Workload(
        model=model,
        make_inputs=lambda: torch.randint(0, vocab, shape, device=config.device),
    )


def encoder_training(config, *, vocab=30522, width=768, heads=12, layers=12, tokens=128):
    """AdamW on a two-label classification of the first token."""
    model = Encoder(vocab, width, heads, layers, 2)
    model = model.to(device=config.device, dtype=config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def make_inputs():
        words = torch.randint(0, vocab, (config.batch, tokens), device=config.device)
        return words, torch.randint(0, 2, (config.batch,), device=config.device)

    def step(model, inputs):
        words, labels = inputs
        return F.cross_entropy(model(words).float(), labels)

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)
