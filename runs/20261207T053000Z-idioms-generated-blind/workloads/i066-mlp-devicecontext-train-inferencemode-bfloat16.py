"""Generated (tests/benchmarks/idiom_points.py): family=mlp, build=device_context, mode=train, step=inference_mode, loss=by_hand, upcast=kept, returns=tensor, extra=hook, dtype=bfloat16."""

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
    with torch.device(config.device):
        model = Model()
    model = model.to(config.dtype)
    model.train()
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output))
    make_inputs = lambda: torch.randn(config.batch, 128, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        with torch.inference_mode():
            out = (seen.clear(), model(inputs))[1]
            return out

    return Workload(model, make_inputs, step=step)
