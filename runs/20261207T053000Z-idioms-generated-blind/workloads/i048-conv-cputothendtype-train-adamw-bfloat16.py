"""Generated (tests/benchmarks/idiom_points.py): family=conv, build=cpu_to_then_dtype, mode=train, step=adamw, loss=by_hand, upcast=kept, returns=output, extra=in_place, dtype=bfloat16."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.drop = torch.nn.Dropout(0.0)
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        h.mul_(2.0)
        return self.head(self.drop(h.mean((2, 3))))


def point(config):
    model = Model().to(config.device).to(config.dtype)
    model.train()
    make_inputs = lambda: torch.randn(config.batch, 3, 32, 32, device=config.device, dtype=config.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model, inputs):
        out = model(inputs)
        return (out - torch.zeros(config.batch, 10, device=config.device, dtype=out.dtype)).pow(2).mean()

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
