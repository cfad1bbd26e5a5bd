"""Model factories. Every model is an nn.Sequential of blocks, so pipelines can split it and local methods add heads."""

from __future__ import annotations

from torch import nn


def mlp(in_features: int, hidden: int, depth: int, classes: int) -> nn.Sequential:
    """Flatten, then `depth` hidden Linear+ReLU blocks, then a Linear classifier block."""
    blocks: list[nn.Module] = []
    width = in_features
    for i in range(depth):
        layers: list[nn.Module] = [nn.Flatten()] if i == 0 else []
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        blocks.append(nn.Sequential(*layers))
        width = hidden
    head: list[nn.Module] = [nn.Flatten()] if depth == 0 else []
    blocks.append(nn.Sequential(*head, nn.Linear(width, classes)))
    return nn.Sequential(*blocks)


def digits_cnn(classes: int = 10, norm: str = "none") -> nn.Sequential:
    """A small CNN for 1x8x8 digits: two conv blocks, a pooled hidden layer and the classifier. `norm` = 'group' puts
    a GroupNorm (4 channels per group) after each convolution: independent of the batch, so it works at batch size 1
    (Pipelined Backpropagation); 'none' (the default) has no normalization."""
    if norm not in ("none", "group"):
        raise ValueError(f"unknown norm {norm!r} (none, group)")

    def normed(channels: int) -> list[nn.Module]:
        return [nn.GroupNorm(channels // 4, channels)] if norm == "group" else []

    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), *normed(16), nn.ReLU()),
        nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), *normed(32), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU()),
        nn.Sequential(nn.Linear(64, classes)),
    )
