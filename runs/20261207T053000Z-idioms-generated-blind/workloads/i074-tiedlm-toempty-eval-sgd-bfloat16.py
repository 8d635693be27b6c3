"""Generated (tests/benchmarks/idiom_points.py): family=tied_lm, build=to_empty, mode=eval, step=sgd, loss=nn, upcast=float, returns=output, extra=none, dtype=bfloat16."""

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
    model.eval()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    def step(model, inputs):
        out = model(inputs)
        logits = out.float()
        return torch.nn.CrossEntropyLoss()(logits.reshape(-1, 1000), inputs.reshape(-1))

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
