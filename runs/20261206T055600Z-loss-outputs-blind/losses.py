"""Models trained with the losses whose reduced result keeps the elementwise loss's block
(mse_loss, smooth_l1_loss, binary_cross_entropy), as users write them with torch.nn built-ins
only, for own_model.py: a tabular regressor, a multi-label classifier ending in a sigmoid,
and a box-regression head. Random weights, nothing downloaded."""

import torch
from own_model import Workload
from torch import nn


def _trained(config, model, make_inputs, loss):
    model = model.to(device=config.device, dtype=config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(model, inputs):
        x, y = inputs
        return loss(model(x), y)

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


def mlp_regressor(config, *, features=256, width=2048, layers=4, outputs=16):
    """nn.MSELoss on a deep MLP."""
    blocks = [nn.Linear(features, width), nn.GELU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*blocks, nn.Linear(width, outputs))

    def make_inputs():
        options = dict(device=config.device, dtype=config.dtype)
        return torch.randn(config.batch, features, **options), torch.randn(
            config.batch, outputs, **options
        )

    return _trained(config, model, make_inputs, nn.MSELoss())


def multilabel_classifier(config, *, features=1024, width=4096, labels=1000):
    """nn.BCELoss after a sigmoid, many labels per row."""
    model = nn.Sequential(
        nn.Linear(features, width), nn.ReLU(), nn.Linear(width, labels), nn.Sigmoid()
    )

    def make_inputs():
        x = torch.randn(config.batch, features, device=config.device, dtype=config.dtype)
        y = torch.randint(0, 2, (config.batch, labels), device=config.device)
        return x, y.to(config.dtype)

    return _trained(config, model, make_inputs, nn.BCELoss())


def box_head(config, *, channels=256, side=7, width=1024, boxes=512):
    """A detector's box-regression head on pooled regions, nn.SmoothL1Loss on 4 numbers a box."""
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(channels * side * side, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4),
    )  # fmt: skip

    def make_inputs():
        options = dict(device=config.device, dtype=config.dtype)
        rows = config.batch * boxes
        return torch.randn(rows, channels, side, side, **options), torch.randn(rows, 4, **options)

    return _trained(config, model, make_inputs, nn.SmoothL1Loss())
