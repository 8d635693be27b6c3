"""A language model whose output layer shares the embedding's weight, reaching the device in
each of the ways users write it. Training steps (AdamW), so that a broken tie shows in the
parameters, their gradients and the optimizer's state."""

import torch
import torch.nn.functional as F
from own_model import Workload


class TiedLM(torch.nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.relu(self.mix(self.emb(ids))))


def _training(model, config, vocab, length=64):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def make_inputs():
        return torch.randint(0, vocab, (config.batch, length), device=config.device)

    def step(model, ids):
        logits = model(ids)
        return F.cross_entropy(logits.view(-1, vocab).float(), ids.view(-1))

    return Workload(model, make_inputs, step=step, optimizer=optimizer)


def cpu_then_to(config, *, vocab=8000, width=512):
    model = TiedLM(vocab, width).to(device=config.device, dtype=config.dtype)
    return _training(model, config, vocab)


def to_device_then_dtype(config, *, vocab=8000, width=512):
    model = TiedLM(vocab, width).to(config.device).to(config.dtype)
    return _training(model, config, vocab)


def on_device(config, *, vocab=8000, width=512):
    with torch.device(config.device):
        model = TiedLM(vocab, width)
    return _training(model.to(config.dtype), config, vocab)


def to_empty_retied(config, *, vocab=8000, width=512):
    with torch.device("meta"):
        model = TiedLM(vocab, width)
    model = model.to_empty(device=config.device).to(config.dtype)
    model.head.weight = model.emb.weight  # to_empty gives each module its own tensor
    return _training(model, config, vocab)


def to_empty_untied(config, *, vocab=8000, width=512):
    with torch.device("meta"):
        model = TiedLM(vocab, width)
    model = model.to_empty(device=config.device).to(config.dtype)
    return _training(model, config, vocab)


def forward_kept(config, *, vocab=8000, width=512):
    """A forward with autograd on, its logits returned: the graph lives until the next step."""
    model = TiedLM(vocab, width).to(device=config.device, dtype=config.dtype)

    def make_inputs():
        return torch.randint(0, vocab, (config.batch, 64), device=config.device)

    return Workload(model, make_inputs, step=lambda model, ids: model(ids))
