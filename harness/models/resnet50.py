"""ResNet-50 (He et al. 2016) as torchvision builds it, cut into the 18 blocks a pipeline can split."""

from __future__ import annotations

from torch import nn


def resnet50(classes: int = 1000) -> nn.Sequential:
    """torchvision's ResNet-50 (weights=None, its own initialization) as an nn.Sequential of 18 blocks.

    Block 0 is the stem (7x7 conv, BN, ReLU, 3x3 max pool), blocks 1..16 the Bottlenecks of layer1..layer4
    (3, 4, 6 and 3 of them), block 17 the head (global average pool, flatten, linear). The parameters are
    torchvision's own modules, so a cut between any two blocks computes what torchvision's forward does.
    """
    from torchvision.models import resnet50 as torchvision_resnet50

    net = torchvision_resnet50(weights=None, num_classes=classes)
    stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
    bottlenecks = [block for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for block in layer]
    head = nn.Sequential(net.avgpool, nn.Flatten(), net.fc)
    return nn.Sequential(stem, *bottlenecks, head)
