"""Generated (tests/benchmarks/idiom_points.py): family=encoder, build=to_empty, mode=train, step=autograd_forward, loss=by_hand, upcast=float, returns=tensor, extra=buffer, dtype=float32."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0,
                                                      batch_first=True)
        self.head = torch.nn.Linear(width, 10)
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x):
        h = self.layer(x)
        return self.head(h.mean(1)) * self.scale


def point(config):
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.train()
    make_inputs = lambda: torch.randn(config.batch, 64, 128, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        out = model(inputs)
        return out.float()

    return Workload(model, make_inputs, step=step)
