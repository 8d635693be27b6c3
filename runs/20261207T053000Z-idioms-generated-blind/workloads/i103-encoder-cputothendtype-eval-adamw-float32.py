"""Generated (tests/benchmarks/idiom_points.py): family=encoder, build=cpu_to_then_dtype, mode=eval, step=adamw, loss=nn, upcast=float, returns=output, extra=none, dtype=float32."""

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
    model = Model().to(config.device).to(config.dtype)
    model.eval()
    make_inputs = lambda: torch.randn(config.batch, 64, 128, device=config.device, dtype=config.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model, inputs):
        out = model(inputs)
        return torch.nn.MSELoss()(out.float(), torch.zeros(config.batch, 10, device=config.device, dtype=out.dtype).float())

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
