"""Generated (tests/benchmarks/idiom_points.py): family=tied_lm, build=to_empty, mode=train, step=inference, loss=nn, upcast=kept, returns=dict, extra=none, dtype=float32."""

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

    def forward(self, ids):
        h = torch.relu(self.mix(self.emb(ids)))
        return self.head(self.drop(h))


def point(config):
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.head.weight = model.emb.weight  # to_empty unties them
    model.train()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    return Workload(model, make_inputs)
