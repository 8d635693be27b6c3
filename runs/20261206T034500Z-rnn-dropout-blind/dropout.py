"""Recurrent models with dropout between their layers in training, as users write them
(torch.nn built-ins only), for own_model.py: PyTorch's word-language-model example as it
ships (nn.LSTM/nn.GRU with `dropout=`, dropout on the embedding and the output too), a
bidirectional tagger and a tanh RNN classifier. Random weights, nothing downloaded.
Dimensions are integers: a dropout is given in percent."""

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


class WordModel(nn.Module):
    """pytorch/examples word_language_model's RNNModel: embedding, dropout, a multi-layer
    recurrent layer with dropout between its layers, dropout, a linear decoder."""

    def __init__(self, kind: str, vocab: int, width: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = getattr(nn, kind)(width, width, layers, dropout=dropout)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, tokens):
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(output))


def _language_model(config, kind, vocab, width, layers, dropout, tokens):
    model = WordModel(kind, vocab, width, layers, dropout)
    model = model.to(device=config.device, dtype=config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def make_inputs():
        words = torch.randint(0, vocab, (tokens + 1, config.batch), device=config.device)
        return words[:-1], words[1:]

    def step(model, inputs):
        words, targets = inputs
        return F.cross_entropy(model(words).flatten(0, 1).float(), targets.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


def word_lstm(config, *, vocab=33278, width=650, layers=2, dropout_percent=50, tokens=35):
    """The example's "medium" LSTM on WikiText-2."""
    return _language_model(config, "LSTM", vocab, width, layers, dropout_percent / 100, tokens)


def word_gru(config, *, vocab=33278, width=650, layers=3, dropout_percent=20, tokens=35):
    return _language_model(config, "GRU", vocab, width, layers, dropout_percent / 100, tokens)


class Tagger(nn.Module):
    def __init__(self, rnn: nn.Module, width: int, tags: int) -> None:
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(width, tags)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def _tagging(config, model, tokens, features, tags):
    model = model.to(device=config.device, dtype=config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def make_inputs():
        x = torch.randn(config.batch, tokens, features, device=config.device, dtype=config.dtype)
        return x, torch.randint(0, tags, (config.batch, tokens), device=config.device)

    def step(model, inputs):
        x, y = inputs
        return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


def bilstm_tagger(
    config, *, features=300, width=512, layers=3, dropout_percent=30, tokens=64, tags=17
):
    rnn = nn.LSTM(
        features, width, layers, batch_first=True, bidirectional=True, dropout=dropout_percent / 100
    )
    return _tagging(config, Tagger(rnn, 2 * width, tags), tokens, features, tags)


def rnn_classifier(
    config, *, features=128, width=768, layers=4, dropout_percent=20, tokens=100, tags=2
):
    rnn = nn.RNN(features, width, layers, dropout=dropout_percent / 100, batch_first=True)
    return _tagging(config, Tagger(rnn, width, tags), tokens, features, tags)


def word_lstm_evaluation(
    config, *, vocab=33278, width=650, layers=2, dropout_percent=50, tokens=35
):
    """The example's evaluation: the same model in eval mode, where no dropout runs."""
    model = WordModel("LSTM", vocab, width, layers, dropout_percent / 100)
    model = model.to(device=config.device, dtype=config.dtype).eval()
    shape = (tokens, config.batch)
    return Workload(
        model=model, make_inputs=lambda: torch.randint(0, vocab, shape, device=config.device)
    )
