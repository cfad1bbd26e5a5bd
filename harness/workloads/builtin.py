"""The built-in workloads: digits (the embedded default), a synthetic MLP, CIFAR-10 ResNets and ImageNet ResNet-50."""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from harness.budget import Budget
from harness.data import sources
from harness.models import simple as models
from harness.workloads.lm import SHAKESPEARE_GPT  # noqa: F401 (registered in BUILTIN below)
from harness.workloads.workload import Instance, NoOptions, Workload


class SyntheticOptions(BaseModel):
    """Sizes of the synthetic-mlp workload."""

    model_config = ConfigDict(extra="forbid")

    in_features: int = Field(default=256, ge=1)
    hidden: int = Field(default=512, ge=1)
    depth: int = Field(default=4, ge=0)
    classes: int = Field(default=10, ge=2)
    num_train: int = Field(default=8192, ge=1)
    num_test: int = Field(default=2048, ge=1)


class DigitsCNNOptions(BaseModel):
    """digits-cnn's normalization: none (default) or GroupNorm after each convolution (works at batch size 1)."""

    model_config = ConfigDict(extra="forbid")

    norm: Literal["none", "group"] = "none"


class ResNetOptions(BaseModel):
    """cifar10-resnet's depth (6n+2: 20, the default, 56, 110, ...) and normalization: BatchNorm (the paper's,
    default) or GroupNorm (works at batch size 1)."""

    model_config = ConfigDict(extra="forbid")

    depth: int = Field(default=20, ge=8, description="6n+2 layers: 20, 32, 44, 56, 110, ...")
    norm: Literal["batch", "group"] = "batch"

    @field_validator("depth")
    @classmethod
    def _six_n_plus_two(cls, depth: int) -> int:
        if (depth - 2) % 6 != 0:
            raise ValueError(f"a CIFAR ResNet's depth is 6n+2 (20, 32, 44, 56, 110, ...), got {depth}")
        return depth


class ImageNetOptions(BaseModel):
    """imagenet-resnet50's input size: RandomResizedCrop's for training, the centre crop's for evaluation."""

    model_config = ConfigDict(extra="forbid")

    image_size: int = Field(default=224, ge=32, description="side of the square crops, in pixels")


class DigitsResNetOptions(BaseModel):
    """Depth and normalization of the digits-resnet workload."""

    model_config = ConfigDict(extra="forbid")

    depth: int = Field(default=20, ge=8, description="6n+2 layers: 8, 14, 20, ...")
    norm: Literal["group", "batch"] = "group"


# Each workload's model alone (Workload.make_model), and its build: the data plus that model's factory.
def _digits_mlp_model(options: NoOptions) -> nn.Sequential:
    return models.mlp(64, 128, 2, 10)


def _digits_mlp(options: NoOptions, data_root: str | None) -> Instance:
    train, test = sources.digits()
    return Instance(train, test, lambda: _digits_mlp_model(options))


def _digits_cnn_model(options: DigitsCNNOptions) -> nn.Sequential:
    return models.digits_cnn(10, options.norm)


def _digits_cnn(options: DigitsCNNOptions, data_root: str | None) -> Instance:
    train, test = sources.digits()
    return Instance(train, test, lambda: _digits_cnn_model(options))


def _synthetic_mlp_model(options: SyntheticOptions) -> nn.Sequential:
    return models.mlp(options.in_features, options.hidden, options.depth, options.classes)


def _synthetic_mlp(options: SyntheticOptions, data_root: str | None) -> Instance:
    o = options
    train, test = sources.synthetic(o.num_train, o.num_test, o.in_features, o.classes)
    return Instance(train, test, lambda: _synthetic_mlp_model(o), classes=o.classes)


def _digits_resnet_model(options: DigitsResNetOptions) -> nn.Sequential:
    from harness.models import resnet

    return resnet.cifar_resnet(options.depth, 10, options.norm, in_channels=1)


def _digits_resnet(options: DigitsResNetOptions, data_root: str | None) -> Instance:
    train, test = sources.digits()
    return Instance(train, test, lambda: _digits_resnet_model(options))


def _cifar10_resnet20_model(options: ResNetOptions) -> nn.Sequential:
    from harness.models import resnet

    return resnet.cifar_resnet(options.depth, 10, options.norm)


def _cifar10_resnet20(options: ResNetOptions, data_root: str | None) -> Instance:
    from harness.data import cifar10

    train, test = cifar10.load(data_root)
    return Instance(train, test, lambda: _cifar10_resnet20_model(options))


def _imagenet_resnet50_model(options: ImageNetOptions, classes: int = 1000) -> nn.Sequential:
    from harness.models.resnet50 import resnet50

    return resnet50(classes)


def _imagenet_resnet50(options: ImageNetOptions, data_root: str | None) -> Instance:
    from harness.data import imagenet

    train, test = imagenet.load(data_root, options.image_size)
    classes = len(train.classes)
    return Instance(train, test, lambda: _imagenet_resnet50_model(options, classes), classes=classes)


#: The digits training set's size: sklearn's 1797 images less the 20% held out (sources.digits' stratified split,
#: test_size=0.2: 360 test images), without importing scikit-learn (tests/suite/test_run_checks.py checks it).
DIGITS_TRAIN_SAMPLES = 1437
#: CIFAR-10's training set, whichever layout it is read from (harness/data/cifar10.py).
CIFAR10_TRAIN_SAMPLES = 50_000


def _digits_samples(options: BaseModel) -> int:
    return DIGITS_TRAIN_SAMPLES


def _synthetic_samples(options: SyntheticOptions) -> int:
    return options.num_train


def _cifar10_samples(options: ResNetOptions) -> int:
    return CIFAR10_TRAIN_SAMPLES


_DIGITS_BUDGET = Budget(max_epochs=10, eval_every_epochs=1, target_accuracy=0.95)

DIGITS_MLP = Workload(
    "digits-mlp", "sklearn digits (8x8, 10 classes)", "MLP 64-128-128-10",
    "the embedded default: 1437 train / 360 test images, CPU seconds per run",
    _digits_mlp, _DIGITS_BUDGET, {"batch_size": 32, "lr": 0.05, "momentum": 0.9}, make_model=_digits_mlp_model,
    train_samples=_digits_samples)
DIGITS_CNN = Workload(
    "digits-cnn", "sklearn digits (8x8, 10 classes)", "CNN conv16-conv32-fc64-10", "digits with a small CNN",
    _digits_cnn, _DIGITS_BUDGET, {"batch_size": 32, "lr": 0.05, "momentum": 0.9}, DigitsCNNOptions, _digits_cnn_model,
    _digits_samples)
SYNTHETIC_MLP = Workload(
    "synthetic-mlp", "synthetic Gaussian, teacher-labelled", "MLP (sizes as options)",
    "random data of any size, for performance work", _synthetic_mlp,
    Budget(max_epochs=5, eval_every_epochs=1, target_accuracy=0.8),
    {"batch_size": 128, "lr": 0.05, "momentum": 0.9}, SyntheticOptions, _synthetic_mlp_model, _synthetic_samples)
DIGITS_RESNET = Workload(
    "digits-resnet", "sklearn digits (8x8, 10 classes)", "ResNet-20 with GroupNorm (depth and norm as options)",
    "a model whose layer graph is not a chain (skip connections), small enough for CPU studies",
    _digits_resnet, _DIGITS_BUDGET, {"batch_size": 32, "lr": 0.05, "momentum": 0.9}, DigitsResNetOptions,
    _digits_resnet_model, _digits_samples)
CIFAR10_RESNET20 = Workload(
    "cifar10-resnet20", "CIFAR-10 (local files)", "ResNet-20 (He et al. 2016, 0.27M params; depth an option)",
    "the standard CIFAR study; needs the dataset on disk (see docs/data.md)", _cifar10_resnet20,
    Budget(max_epochs=160, eval_every_epochs=1, target_accuracy=0.91),
    {"batch_size": 128, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}, ResNetOptions, _cifar10_resnet20_model,
    _cifar10_samples)
#: The same workload under a name that does not fix the depth (the target stays ResNet-20's: set a deeper one's).
CIFAR10_RESNET = dataclasses.replace(
    CIFAR10_RESNET20, name="cifar10-resnet",
    model="CIFAR ResNet, depth 6n+2 (He et al. 2016; 20, the default: 0.27M params, 56: 0.85M, 110: 1.7M)",
    summary="cifar10-resnet20 with the depth named as an option (workload_options = {depth = 110})")
IMAGENET_RESNET50 = Workload(
    "imagenet-resnet50", "ImageNet (ILSVRC 2012, an ImageFolder on disk)", "ResNet-50 (torchvision, 25.6M params)",
    "the standard ImageNet study: 90 epochs at batch 256; needs the dataset on disk (see docs/data.md)",
    _imagenet_resnet50, Budget(max_epochs=90, eval_every_epochs=1, target_accuracy=0.75),
    {"batch_size": 256, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}, ImageNetOptions, _imagenet_resnet50_model)

#: Built-in workload names -> attributes of this module (harness/registry.py imports them by reference).
BUILTIN: dict[str, str] = {"digits-mlp": "DIGITS_MLP", "digits-cnn": "DIGITS_CNN", "synthetic-mlp": "SYNTHETIC_MLP",
                           "cifar10-resnet20": "CIFAR10_RESNET20", "digits-resnet": "DIGITS_RESNET",
                           "shakespeare-gpt": "SHAKESPEARE_GPT",
                           "cifar10-resnet": "CIFAR10_RESNET", "imagenet-resnet50": "IMAGENET_RESNET50"}
