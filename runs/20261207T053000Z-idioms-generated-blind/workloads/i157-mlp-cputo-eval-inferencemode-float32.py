"""Generated (tests/benchmarks/idiom_points.py): family=mlp, build=cpu_to, mode=eval, step=inference_mode, loss=nn, upcast=kept, returns=tuple, extra=hook, dtype=float32."""

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
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output))
    make_inputs = lambda: torch.randn(config.batch, 128, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        with torch.inference_mode():
            out = (seen.clear(), model(inputs))[1]
            return out, out.argmax(-1)

    return Workload(model, make_inputs, step=step)
