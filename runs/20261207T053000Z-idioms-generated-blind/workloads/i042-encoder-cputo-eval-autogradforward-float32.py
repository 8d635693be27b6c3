"""Generated (tests/benchmarks/idiom_points.py): family=encoder, build=cpu_to, mode=eval, step=autograd_forward, loss=nn, upcast=float, returns=dict, extra=hook, dtype=float32."""

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
        return self.head(h.mean(1))


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output))
    make_inputs = lambda: torch.randn(config.batch, 64, 128, device=config.device, dtype=config.dtype)

    def step(model, inputs):
        out = (seen.clear(), model(inputs))[1]
        return {"logits": out.float()}

    return Workload(model, make_inputs, step=step)
