"""A word-level LSTM language model, the shape of PyTorch's own `word_language_model`
example (pytorch/examples: embedding, dropout, a multi-layer nn.LSTM, dropout, a linear
decoder; its "medium" setting: 650 units, 2 layers, 35 tokens of WikiText-2's 33,278-word
vocabulary, batch 20): `own_model.py --workload pipeline/workloads/lstm_lm.py:lstm_lm`
(one AdamW step on next-word prediction, the model in training mode) or `:lstm_lm_inference`
(the forward in evaluation mode).

Torch only, random weights, nothing downloaded. The layers have no dropout between them
(nn.LSTM's `dropout`): cuDNN's dropout state is not followed by the trace yet, so the
prediction would give no bounds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, layers)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens):  # (tokens, batch), as the example feeds them
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(output))


def lstm_lm(config, *, vocab=33278, width=650, layers=2, tokens=35):
    """AdamW on next-word prediction."""
    model = LanguageModel(vocab, width, layers).to(device=config.device, dtype=config.dtype)

    def make_inputs():
        words = torch.randint(0, vocab, (tokens + 1, config.batch), device=config.device)
        return words[:-1], words[1:]

    optimizer = torch.optim.AdamW(model.train().parameters(), lr=1e-3)

    def step(model, inputs):
        words, targets = inputs
        return F.cross_entropy(model(words).flatten(0, 1).float(), targets.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


def lstm_lm_inference(config, *, vocab=33278, width=650, layers=2, tokens=35):
    """The forward over `tokens` words, in evaluation mode."""
    model = LanguageModel(vocab, width, layers).to(device=config.device, dtype=config.dtype)
    shape = (tokens, config.batch)
    return Workload(
        model=model.eval(),
        make_inputs=lambda: torch.randint(0, vocab, shape, device=config.device),
    )
