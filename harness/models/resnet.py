"""CIFAR ResNets of He et al. 2016 (depth 6n+2, option-A shortcuts) as an nn.Sequential of blocks."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

STAGE_WIDTHS = (16, 32, 64)
#: Channels per group of the GroupNorm variant (Wu and He, 2018): 16/32/64 channels -> 4/8/16 groups.
GROUP_CHANNELS = 4


def norm_layer(kind: str, channels: int) -> nn.Module:
    """BatchNorm2d ('batch', the paper's) or GroupNorm with GROUP_CHANNELS channels per group ('group': independent of
    the batch, so usable at batch size 1, as Pipelined Backpropagation needs)."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(max(1, channels // GROUP_CHANNELS), channels)
    raise ValueError(f"unknown norm {kind!r} (batch, group)")


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 conv+BN layers plus a parameter-free (option A) shortcut, then ReLU.

    When the block halves the resolution and widens the channels, the shortcut takes every second pixel of the
    input and appends zero channels (He et al. 2016, section 4.2, option A).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, norm: str = "batch"):
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(f"BasicBlock cannot narrow channels ({in_channels} -> {out_channels})")
        self.stride = stride
        self.extra_channels = out_channels - in_channels
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = norm_layer(norm, out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = norm_layer(norm, out_channels)

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, ::self.stride, ::self.stride]
        if self.extra_channels:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _init_weights(model: nn.Module) -> None:
    """Kaiming-normal convs, std sqrt(2 / (k*k*out_channels)) as in fb.resnet.torch; BN starts as identity."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)


def cifar_resnet(depth: int, classes: int = 10, norm: str = "batch", in_channels: int = 3) -> nn.Sequential:
    """A CIFAR ResNet of `depth` = 6n+2 layers: stem, 3n BasicBlocks (widths 16/32/64), head; `norm` = 'batch' or
    'group' (norm_layer).

    Block 0 is the stem (3x3 conv to 16 channels, BN, ReLU), blocks 1..3n the BasicBlocks, block 3n+1 the head
    (global average pool, flatten, linear). Input N x in_channels x H x W (3 x 32 x 32 for CIFAR; 1 x 8 x 8 for
    digits-resnet), output N x classes logits.
    """
    if depth < 8 or (depth - 2) % 6 != 0:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...), "
                         f"got {depth}")
    blocks_per_stage = (depth - 2) // 6
    width = STAGE_WIDTHS[0]
    blocks: list[nn.Module] = [nn.Sequential(_conv3x3(in_channels, width), norm_layer(norm, width), nn.ReLU())]
    for stage, stage_width in enumerate(STAGE_WIDTHS):
        for i in range(blocks_per_stage):
            stride = 2 if stage > 0 and i == 0 else 1
            blocks.append(BasicBlock(width, stage_width, stride, norm))
            width = stage_width
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)))
    model = nn.Sequential(*blocks)
    _init_weights(model)
    return model


def resnet20(classes: int = 10, norm: str = "batch") -> nn.Sequential:
    """ResNet-20 for CIFAR: 11 blocks (stem, 9 BasicBlocks, head), 269,722 parameters with 10 classes.

    The count is option A's (parameter-free shortcuts). 272,474, sometimes quoted, is option B: it adds a 1x1
    conv + BN projection at the two downsampling blocks (576 + 2,176 parameters).
    """
    return cifar_resnet(20, classes, norm)
