"""Generated (tests/benchmarks/idiom_points.py): family=mlp, build=to_empty, mode=eval, step=no_grad, loss=by_hand, upcast=float, returns=dict, extra=hook, dtype=bfloat16."""

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
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.eval()
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output))
    make_inputs = lambda: torch.randn(config.batch, 128, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        with torch.no_grad():
            out = (seen.clear(), model(inputs))[1]
            return {"logits": out.float()}

    return Workload(model, make_inputs, step=step)
