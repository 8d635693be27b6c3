"""Generated (tests/benchmarks/idiom_points.py): family=encoder, build=device_context, mode=train, step=no_grad, loss=nn, upcast=kept, returns=output, extra=in_place, dtype=bfloat16."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0,
                                                      batch_first=True)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        h = self.layer(x)
        h.mul_(2.0)
        return self.head(h.mean(1))


def point(config):
    with torch.device(config.device):
        model = Model()
    model = model.to(config.dtype)
    model.train()
    make_inputs = lambda: torch.randn(config.batch, 64, 128, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        with torch.no_grad():
            out = model(inputs)
            return out

    return Workload(model, make_inputs, step=step)
