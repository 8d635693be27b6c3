"""Generated (tests/benchmarks/idiom_points.py): family=encoder, build=to_empty, mode=train, step=inference, loss=nn, upcast=kept, returns=dict, extra=dropout, dtype=bfloat16."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1,
                                                      batch_first=True)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        h = self.layer(x)
        return self.head(h.mean(1))


def point(config):
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.train()
    make_inputs = lambda: torch.randn(config.batch, 64, 128, device=config.device, dtype=config.dtype)
    return Workload(model, make_inputs)
