"""Generated (tests/benchmarks/idiom_points.py): family=mlp, build=cpu_to, mode=eval, step=adamw, loss=by_hand, upcast=float, returns=output, extra=dropout, dtype=float32."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.up = torch.nn.Linear(128, width)
        self.act = torch.nn.GELU()
        self.drop = torch.nn.Dropout(0.1)
        self.down = torch.nn.Linear(width, 10)

    def forward(self, x):
        h = self.act(self.up(x))
        return self.down(self.drop(h))


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    make_inputs = lambda: torch.randn(config.batch, 128, device=config.device, dtype=config.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model, inputs):
        out = model(inputs)
        return (out.float() - torch.zeros(config.batch, 10, device=config.device, dtype=out.dtype).float()).pow(2).mean()

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
