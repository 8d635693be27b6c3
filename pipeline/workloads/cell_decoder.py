"""A caption decoder unrolled one word at a time with nn.LSTMCell or nn.GRUCell, the shape
of the "Show, Attend and Tell" decoders users train (embedding, a recurrent cell stepped in
a Python loop, a linear layer over the vocabulary; here without the image's attention):
`own_model.py --workload pipeline/workloads/cell_decoder.py:lstm_cell_decoder` (one AdamW
step on next-word prediction, teacher-forced), `:lstm_cell_decoder_without_bias`,
`:gru_cell_decoder`, or
`:lstm_cell_inference` (the loop in evaluation mode, under no_grad).

On a GPU each step of the loop is two matrix products and one fused kernel
(`_thnn_fused_lstm_cell` or `_thnn_fused_gru_cell`), which the GPU-free trace follows for a
target GPU. Torch only, random weights, nothing downloaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class CellDecoder(nn.Module):
    def __init__(self, cell: type, vocab: int, width: int, bias: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.cell = cell(width, width, bias=bias)
        self.head = nn.Linear(width, vocab)

    def forward(self, words):  # (batch, tokens)
        inputs, state, outputs = self.embed(words), None, []
        for t in range(words.size(1)):
            state = self.cell(inputs[:, t], state)
            outputs.append(state[0] if isinstance(state, tuple) else state)
        return self.head(torch.stack(outputs, 1))


def _training(config, cell, vocab, width, tokens, bias):
    model = CellDecoder(cell, vocab, width, bias).to(device=config.device, dtype=config.dtype)
    optimizer = torch.optim.AdamW(model.train().parameters(), lr=1e-3)

    def make_inputs():
        words = torch.randint(0, vocab, (config.batch, tokens + 1), device=config.device)
        return words[:, :-1], words[:, 1:]

    def step(model, inputs):
        words, targets = inputs
        return F.cross_entropy(model(words).flatten(0, 1).float(), targets.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


def lstm_cell_decoder(config, *, vocab=10000, width=512, tokens=20):
    """AdamW on next-word prediction, an LSTMCell stepped over `tokens` words."""
    return _training(config, nn.LSTMCell, vocab, width, tokens, bias=True)


def lstm_cell_decoder_without_bias(config, *, vocab=10000, width=512, tokens=20):
    """The same, the cell without biases (nn.LSTMCell(..., bias=False))."""
    return _training(config, nn.LSTMCell, vocab, width, tokens, bias=False)


def gru_cell_decoder(config, *, vocab=10000, width=512, tokens=20):
    """AdamW on next-word prediction, a GRUCell stepped over `tokens` words."""
    return _training(config, nn.GRUCell, vocab, width, tokens, bias=True)


def lstm_cell_inference(config, *, vocab=10000, width=512, tokens=20):
    """The LSTMCell loop over `tokens` words, in evaluation mode."""
    model = CellDecoder(nn.LSTMCell, vocab, width, True)
    model = model.to(device=config.device, dtype=config.dtype).eval()
    shape = (config.batch, tokens)
    return Workload(
        model=model,
        make_inputs=lambda: torch.randint(0, vocab, shape, device=config.device),
    )
