"""Recurrent models fed packed sequences, as users write them (torch.nn built-ins only):
lengths known on the CPU before the step (a data loader's collate function makes them so)."""

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Encoder(nn.Module):
    """A bidirectional GRU over time-major padded input, sorted by length (enforce_sorted)."""

    def __init__(self, features, width, layers, classes):
        super().__init__()
        self.rnn = nn.GRU(features, width, layers, bidirectional=True)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths)
        out, h = self.rnn(packed)
        out, _ = pad_packed_sequence(out)
        return self.head(out.mean(0))


def sorted_lengths(batch, tokens):
    """Lengths from tokens down to a quarter of it, longest first, as a sorting collate
    function gives them."""
    return [tokens - (tokens * 3 // 4) * i // max(batch - 1, 1) for i in range(batch)]


def gru_classifier(config, *, features=80, width=320, layers=3, tokens=200, classes=40):
    model = Encoder(features, width, layers, classes).to(config.device, config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = torch.tensor(sorted_lengths(config.batch, tokens))

    def make_inputs():
        x = torch.randn(tokens, config.batch, features, device=config.device, dtype=config.dtype)
        y = torch.randint(0, classes, (config.batch,), device=config.device)
        return x, y

    def step(model, inputs):
        x, y = inputs
        return F.cross_entropy(model(x, lengths).float(), y)

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


class LanguageModel(nn.Module):
    """An LSTM language model with dropout between layers, batch-first, unsorted lengths."""

    def __init__(self, vocab, width, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, layers, dropout=0.2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(
            self.embed(tokens), lengths, batch_first=True, enforce_sorted=False
        )
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.size(1))
        return self.head(out)


def lstm_lm(config, *, vocab=8000, width=512, layers=2, tokens=96):
    model = LanguageModel(vocab, width, layers).to(config.device, config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = (torch.arange(config.batch) * 37) % tokens + 1  # uneven, unsorted

    def make_inputs():
        return torch.randint(0, vocab, (config.batch, tokens), device=config.device)

    def step(model, tokens_in):
        logits = model(tokens_in, lengths)
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens_in.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)
