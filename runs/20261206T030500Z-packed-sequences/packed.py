"""A sequence tagger fed padded batches of uneven lengths through pack_padded_sequence,
as users write it (torch.nn built-ins only): the sizes of the packed data come from the
lengths' values, which a trace on fake tensors does not have."""

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Tagger(nn.Module):
    def __init__(self, features, width, tags):
        super().__init__()
        self.rnn = nn.LSTM(features, width, 2, batch_first=True)
        self.head = nn.Linear(width, tags)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return self.head(out)


def packed_tagger(config, *, features=128, width=256, tokens=50, tags=10):
    model = Tagger(features, width, tags).to(config.device, config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters())

    def make_inputs():
        x = torch.randn(config.batch, tokens, features, device=config.device, dtype=config.dtype)
        y = torch.randint(0, tags, (config.batch, tokens), device=config.device)
        return x, y

    def step(model, inputs):
        x, y = inputs
        lengths = torch.arange(x.size(0)) % x.size(1) + 1
        return F.cross_entropy(model(x, lengths).flatten(0, 1).float(), y.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)
