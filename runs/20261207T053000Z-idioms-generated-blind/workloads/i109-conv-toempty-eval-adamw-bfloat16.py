"""Generated (tests/benchmarks/idiom_points.py): family=conv, build=to_empty, mode=eval, step=adamw, loss=nn, upcast=kept, returns=tensor, extra=dropout, dtype=bfloat16."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        return self.head(self.drop(h.mean((2, 3))))


def point(config):
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.eval()
    make_inputs = lambda: torch.randn(config.batch, 3, 32, 32, device=config.device, dtype=config.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model, inputs):
        out = model(inputs)
        return torch.nn.MSELoss()(out, torch.zeros(config.batch, 10, device=config.device, dtype=out.dtype))

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
