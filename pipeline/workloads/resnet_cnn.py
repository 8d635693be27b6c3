"""A ResNet-style CNN for image classification, inference: `own_model.py --workload
pipeline/workloads/resnet_cnn.py:resnet`.

Torch only, random weights, nothing downloaded. A stem convolution (stride 2), `stages`
stages of `blocks` basic residual blocks (3x3 convolutions, batch norm, ReLU; each stage
after the first halves the image and doubles the channels), global average pooling and a
linear classifier. The model is built on the CPU in float32 and then moved and cast in one
`.to(device, dtype)`, as most training scripts do.
"""

from __future__ import annotations

import torch
from own_model import Workload
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = None
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.shortcut is None else self.shortcut(x)))


def build(width: int, stages: int, blocks: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, 2, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    channels = width
    for stage in range(stages):
        out = width * 2**stage
        for block in range(blocks):
            layers.append(BasicBlock(channels, out, 2 if stage and not block else 1))
            channels = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


def resnet(config, *, image=32, width=16, stages=3, blocks=1, classes=10):
    """Inference on `batch` random images of image x image pixels, three channels."""
    model = build(width, stages, blocks, classes).to(device=config.device, dtype=config.dtype)

    def make_inputs():
        shape = (config.batch, 3, image, image)
        return torch.randn(shape, device=config.device, dtype=config.dtype)

    return Workload(model=model.eval(), make_inputs=make_inputs)
