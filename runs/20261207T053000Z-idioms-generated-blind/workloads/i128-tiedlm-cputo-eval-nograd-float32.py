"""Generated (tests/benchmarks/idiom_points.py): family=tied_lm, build=cpu_to, mode=eval, step=no_grad, loss=by_hand, upcast=kept, returns=tuple, extra=buffer, dtype=float32."""

import torch
from own_model import Workload

class Model(torch.nn.Module):
    def __init__(self, vocab=1000, width=256):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)
        self.drop = torch.nn.Dropout(0.0)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.ones(1))

    def forward(self, ids):
        h = torch.relu(self.mix(self.emb(ids)))
        return self.head(self.drop(h)) * self.scale


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)

    def step(model, inputs):
        with torch.no_grad():
            out = model(inputs)
            return out, out.argmax(-1)

    return Workload(model, make_inputs, step=step)
