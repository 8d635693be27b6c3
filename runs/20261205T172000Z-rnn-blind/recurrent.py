"""Recurrent models a user might size, as own_model.py workloads (torch.nn built-ins only):
a bidirectional GRU tagger (training), an LSTM with projections (training), a tanh RNN
encoder (inference)."""

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class Tagger(nn.Module):
    def __init__(self, rnn: nn.Module, width: int, tags: int) -> None:
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(width, tags)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def _training(config, model, tokens, features, tags):
    model = model.to(device=config.device, dtype=config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def make_inputs():
        x = torch.randn(config.batch, tokens, features, device=config.device, dtype=config.dtype)
        return x, torch.randint(0, tags, (config.batch, tokens), device=config.device)

    def step(model, inputs):
        x, y = inputs
        return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


def gru_tagger(config, *, features=300, width=256, layers=2, tokens=128, tags=20):
    rnn = nn.GRU(features, width, layers, batch_first=True, bidirectional=True)
    return _training(config, Tagger(rnn, 2 * width, tags), tokens, features, tags)


def lstm_projected(config, *, features=512, width=1024, proj=256, layers=2, tokens=200, tags=50):
    rnn = nn.LSTM(features, width, layers, batch_first=True, proj_size=proj)
    return _training(config, Tagger(rnn, proj, tags), tokens, features, tags)


def rnn_encoder(config, *, features=128, width=512, layers=3, tokens=400):
    model = nn.RNN(features, width, layers, nonlinearity="tanh").to(config.device, config.dtype)
    shape = (tokens, config.batch, features)
    return Workload(
        model=model.eval(),
        make_inputs=lambda: torch.randn(shape, device=config.device, dtype=config.dtype),
    )
