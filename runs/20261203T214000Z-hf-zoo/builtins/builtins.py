"""torch.nn built-ins as own-model workloads, for the zoo grid."""
import torch
from own_model import Workload

nn = torch.nn


def linear(config, *, features=1024, out=4096):
    model = nn.Linear(features, out).to(device=config.device, dtype=config.dtype)
    return Workload(model, lambda: torch.randn((config.batch, features), device=config.device, dtype=config.dtype))


def mlp_adamw(config, *, width=2048):
    model = nn.Sequential(nn.Linear(512, width), nn.GELU(), nn.Linear(width, 512)).to(config.device, config.dtype)
    optimizer = torch.optim.AdamW(model.parameters())
    def step(model, x):
        return model(x).float().square().mean()
    return Workload(model, lambda: torch.randn(config.batch, 512, device=config.device, dtype=config.dtype), step, optimizer)


def encoder_training(config, *, sequence=256, width=512):
    layer = nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True)
    model = nn.TransformerEncoder(layer, 4).to(config.device, config.dtype)
    optimizer = torch.optim.AdamW(model.parameters())
    def step(model, x):
        return model(x).float().square().mean()
    return Workload(model, lambda: torch.randn(config.batch, sequence, width, device=config.device, dtype=config.dtype), step, optimizer)


def lstm_training(config, *, sequence=128, width=512):
    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(width, width, num_layers=2, batch_first=True)
        def forward(self, x):
            return self.rnn(x)[0]
    model = Last().to(config.device, config.dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    def step(model, x):
        return model(x).float().square().mean()
    return Workload(model, lambda: torch.randn(config.batch, sequence, width, device=config.device, dtype=config.dtype), step, optimizer)


def conv_training(config, *, size=64):
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.GroupNorm(8, 128), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    ).to(config.device, config.dtype)
    optimizer = torch.optim.AdamW(model.parameters())
    def step(model, x):
        return model(x).float().square().mean()
    return Workload(model, lambda: torch.randn(config.batch, 3, size, size, device=config.device, dtype=config.dtype), step, optimizer)
