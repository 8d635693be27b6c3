"""A regressor that predicts a mean and a variance, trained with F.gaussian_nll_loss
(torch.nn built-ins only): the loss checks that no variance is negative by reading a value."""

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class Regressor(nn.Module):
    def __init__(self, features, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, width), nn.GELU(), nn.Linear(width, 2))

    def forward(self, x):
        mean, raw = self.body(x).unbind(-1)
        return mean, F.softplus(raw)


def heteroscedastic(config, *, features=64, width=1024):
    model = Regressor(features, width).to(config.device, config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters())

    def make_inputs():
        x = torch.randn(config.batch, features, device=config.device, dtype=config.dtype)
        return x, torch.randn(config.batch, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        x, y = inputs
        mean, var = model(x)
        return F.gaussian_nll_loss(mean, y, var)

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)
