"""Generated (tests/benchmarks/idiom_points.py): family=mlp, build=cpu_to_then_dtype, mode=train, step=sgd, loss=by_hand, upcast=float, returns=dict, extra=none, dtype=bfloat16."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.up = torch.nn.Linear(128, width)
        self.act = torch.nn.GELU()
        self.drop = torch.nn.Dropout(0.0)
        self.down = torch.nn.Linear(width, 10)

    def forward(self, x):
        h = self.act(self.up(x))
        return self.down(self.drop(h))


def point(config):
    model = Model().to(config.device).to(config.dtype)
    model.train()
    make_inputs = lambda: torch.randn(config.batch, 128, device=config.device, dtype=config.dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    def step(model, inputs):
        out = model(inputs)
        return (out.float() - torch.zeros(config.batch, 10, device=config.device, dtype=out.dtype).float()).pow(2).mean()

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
