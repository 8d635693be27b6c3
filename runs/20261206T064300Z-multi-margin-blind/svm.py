"""A linear classifier trained with nn.MultiMarginLoss (a multi-class hinge loss), torch.nn
built-ins only, for own_model.py. Random weights, nothing downloaded."""

import torch
from own_model import Workload
from torch import nn


def svm_head(config, *, features=512, classes=100):
    model = nn.Sequential(nn.Linear(features, 2048), nn.ReLU(), nn.Linear(2048, classes))
    model = model.to(device=config.device, dtype=config.dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def make_inputs():
        x = torch.randn(config.batch, features, device=config.device, dtype=config.dtype)
        return x, torch.randint(0, classes, (config.batch,), device=config.device)

    def step(model, inputs):
        x, y = inputs
        return nn.MultiMarginLoss()(model(x), y)

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)
