"""Models trained with the CTC loss (torch.nn built-ins only), as users write them: the
lengths made on the CPU, as a data loader's collate function makes them."""

import torch
import torch.nn.functional as F
from own_model import Workload
from torch import nn


def frame_model(features, width, classes):
    return nn.Sequential(
        nn.Linear(features, width),
        nn.GELU(),
        nn.Linear(width, width),
        nn.GELU(),
        nn.Linear(width, classes),
    )


def padded_targets(config, *, features=80, width=512, classes=64, frames=400, labels=120):
    """Frames (time-major) to characters; padded 2-D targets on the GPU, mean reduction."""
    model = frame_model(features, width, classes).to(config.device, config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters())
    input_lengths = torch.full((config.batch,), frames, dtype=torch.long)
    target_lengths = torch.tensor([labels - (7 * i) % 40 for i in range(config.batch)])
    loss_fn = nn.CTCLoss(blank=0)

    def make_inputs():
        x = torch.randn(frames, config.batch, features, device=config.device, dtype=config.dtype)
        y = torch.randint(1, classes, (config.batch, labels), device=config.device)
        return x, y

    def step(model, inputs):
        x, y = inputs
        log_probs = model(x).float().log_softmax(-1)
        return loss_fn(log_probs, y, input_lengths, target_lengths)

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


def concatenated_targets(config, *, features=40, width=256, classes=28, frames=60, labels=20):
    """Short utterances; targets concatenated on the CPU (int64), uneven input lengths,
    summed, infinite losses zeroed."""
    model = frame_model(features, width, classes).to(config.device, config.dtype).train()
    optimizer = torch.optim.AdamW(model.parameters())
    input_lengths = [frames - (3 * i) % 20 for i in range(config.batch)]
    target_lengths = [labels - (5 * i) % 12 for i in range(config.batch)]
    targets = torch.randint(1, classes, (sum(target_lengths),))

    def make_inputs():
        return torch.randn(frames, config.batch, features, device=config.device, dtype=config.dtype)

    def step(model, x):
        log_probs = F.log_softmax(model(x).float(), dim=-1)
        return F.ctc_loss(
            log_probs, targets, input_lengths, target_lengths, reduction="sum", zero_infinity=True
        )

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)


class Encoder(nn.Module):
    def __init__(self, features, width, heads, layers, classes):
        super().__init__()
        self.inp = nn.Linear(features, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        return self.out(self.encoder(self.inp(x)))


def transformer(
    config, *, features=80, width=256, heads=4, layers=4, classes=500, frames=256, labels=60
):
    """A batch-first transformer encoder over subword units; log-probabilities transposed to
    time-major (not contiguous), mean reduction, int64 targets on the GPU."""
    model = Encoder(features, width, heads, layers, classes).to(config.device, config.dtype)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters())
    input_lengths = torch.tensor([frames - (11 * i) % 64 for i in range(config.batch)])
    target_lengths = torch.tensor([labels - (3 * i) % 30 for i in range(config.batch)])

    def make_inputs():
        x = torch.randn(config.batch, frames, features, device=config.device, dtype=config.dtype)
        y = torch.randint(1, classes, (config.batch, labels), device=config.device)
        return x, y

    def step(model, inputs):
        x, y = inputs
        log_probs = model(x).float().log_softmax(-1).transpose(0, 1)
        return F.ctc_loss(log_probs, y, input_lengths, target_lengths)

    return Workload(model=model, make_inputs=make_inputs, step=step, optimizer=optimizer)
