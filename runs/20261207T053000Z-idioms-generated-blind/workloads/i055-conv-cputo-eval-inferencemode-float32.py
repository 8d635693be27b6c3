"""Generated (tests/benchmarks/idiom_points.py): family=conv, build=cpu_to, mode=eval, step=inference_mode, loss=by_hand, upcast=float, returns=output, extra=in_place, dtype=float32."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.drop = torch.nn.Dropout(0.0)
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        h.mul_(2.0)
        return self.head(self.drop(h.mean((2, 3))))


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    make_inputs = lambda: torch.randn(config.batch, 3, 32, 32, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        with torch.inference_mode():
            out = model(inputs)
            return out.float()

    return Workload(model, make_inputs, step=step)
