"""Generated (tests/benchmarks/idiom_points.py): family=mlp, build=to_empty, mode=eval, step=adamw, loss=by_hand, upcast=kept, returns=dict, extra=buffer, dtype=bfloat16."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.up = torch.nn.Linear(128, width)
        self.act = torch.nn.GELU()
        self.drop = torch.nn.Dropout(0.0)
        self.down = torch.nn.Linear(width, 10)
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x):
        h = self.act(self.up(x))
        return self.down(self.drop(h)) * self.scale


def point(config):
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.eval()
    make_inputs = lambda: torch.randn(config.batch, 128, device=config.device, dtype=config.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model, inputs):
        out = model(inputs)
        return (out - torch.zeros(config.batch, 10, device=config.device, dtype=out.dtype)).pow(2).mean()

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
