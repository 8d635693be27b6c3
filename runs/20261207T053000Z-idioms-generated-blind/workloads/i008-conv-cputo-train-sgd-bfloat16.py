"""Generated (tests/benchmarks/idiom_points.py): family=conv, build=cpu_to, mode=train, step=sgd, loss=by_hand, upcast=float, returns=tensor, extra=buffer, dtype=bfloat16."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.drop = torch.nn.Dropout(0.0)
        self.head = torch.nn.Linear(channels, 10)
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        return self.head(self.drop(h.mean((2, 3)))) * self.scale


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.train()
    make_inputs = lambda: torch.randn(config.batch, 3, 32, 32, device=config.device, dtype=config.dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    def step(model, inputs):
        out = model(inputs)
        return (out.float() - torch.zeros(config.batch, 10, device=config.device, dtype=out.dtype).float()).pow(2).mean()

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
