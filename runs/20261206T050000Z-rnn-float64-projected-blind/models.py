"""Recurrent models the trace did not follow before 2026-12-06, as users write them (torch.nn
built-ins only), for own_model.py: an LSTM with projections (`proj_size`, the LSTMP of speech
and language models) and dropout between its layers, and recurrent models kept in float64
(time series and physics users train in double precision whatever `--dtype` says). Random
weights, nothing downloaded. Dimensions are integers: a dropout is given in percent."""

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class ProjectedLM(nn.Module):
    """Embedding, dropout, an LSTM with projections and dropout between layers, a decoder
    from the projected width."""

    def __init__(self, vocab, width, proj, layers, dropout, bidirectional) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(
            width, width, layers, dropout=dropout, proj_size=proj, bidirectional=bidirectional
        )
        self.decoder = nn.Linear(proj * (2 if bidirectional else 1), vocab)

    def forward(self, tokens):
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(output))


def lstmp_lm(
    config, *, vocab=10000, width=1024, proj=256, layers=3, dropout_percent=20, tokens=35,
    directions=1,
):  # fmt: skip
    model = ProjectedLM(vocab, width, proj, layers, dropout_percent / 100, directions == 2)
    model = model.to(device=config.device, dtype=config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def make_inputs():
        words = torch.randint(0, vocab, (tokens + 1, config.batch), device=config.device)
        return words[:-1], words[1:]

    def step(model, inputs):
        words, targets = inputs
        return F.cross_entropy(model(words).flatten(0, 1).float(), targets.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


class Regressor(nn.Module):
    def __init__(self, rnn: nn.Module, width: int, outputs: int) -> None:
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(width, outputs)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def _double(config, rnn, width, features, tokens, outputs, train=True):
    """A sequence regressor in float64 (the workload's own dtype, not --dtype)."""
    model = Regressor(rnn, width, outputs).to(device=config.device, dtype=torch.float64)
    shape = (config.batch, tokens, features)
    if not train:
        model.eval()
        return Workload(
            model=model,
            make_inputs=lambda: torch.randn(shape, device=config.device, dtype=torch.float64),
        )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def make_inputs():
        x = torch.randn(shape, device=config.device, dtype=torch.float64)
        return x, torch.randn(config.batch, tokens, outputs, device=config.device, dtype=x.dtype)

    def step(model, inputs):
        x, y = inputs
        return F.mse_loss(model(x), y)

    return Workload(model=model.train(), make_inputs=make_inputs, step=step, optimizer=optimizer)


def double_lstm(config, *, features=32, width=256, layers=2, tokens=200, outputs=4):
    rnn = nn.LSTM(features, width, layers, batch_first=True)
    return _double(config, rnn, width, features, tokens, outputs)


def double_gru_dropout(
    config, *, features=64, width=512, layers=3, dropout_percent=20, tokens=100, outputs=8
):
    rnn = nn.GRU(features, width, layers, batch_first=True, dropout=dropout_percent / 100)
    return _double(config, rnn, width, features, tokens, outputs)


def double_lstmp_bidirectional(
    config, *, features=40, width=512, proj=128, layers=3, dropout_percent=10, tokens=150
):
    rnn = nn.LSTM(features, width, layers, batch_first=True, bidirectional=True,
                  proj_size=proj, dropout=dropout_percent / 100)  # fmt: skip
    return _double(config, rnn, 2 * proj, features, tokens, 2)


def double_lstm_evaluation(config, *, features=32, width=256, layers=2, tokens=200, outputs=4):
    rnn = nn.LSTM(features, width, layers, batch_first=True)
    return _double(config, rnn, width, features, tokens, outputs, train=False)
