"""Gaussian blobs classified by a small MLP: a complete dtbench workload outside the dtbench tree."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from harness.budget import Budget
from harness.data.tensors import TensorData
from harness.models.simple import mlp
from harness.workloads.workload import Instance, Workload


class BlobsOptions(BaseModel):
    """How many blobs, how far apart, and how many samples."""

    model_config = ConfigDict(extra="forbid")

    classes: int = Field(default=4, ge=2)
    features: int = Field(default=8, ge=1)
    spread: float = Field(default=1.0, gt=0, description="standard deviation of each blob")
    num_train: int = Field(default=512, ge=1)
    num_test: int = Field(default=256, ge=1)


def build(options: BlobsOptions, data_root: str | None) -> Instance:
    """Blob centres on a fixed seed, so every run of a suite sees the same data; no files needed."""
    g = torch.Generator().manual_seed(42)
    centres = 3 * torch.randn(options.classes, options.features, generator=g)
    n = options.num_train + options.num_test
    y = torch.randint(options.classes, (n,), generator=g)
    x = centres[y] + options.spread * torch.randn(n, options.features, generator=g)
    train = TensorData(x[:options.num_train], y[:options.num_train])
    test = TensorData(x[options.num_train:], y[options.num_train:])
    return Instance(train, test, lambda: mlp(options.features, 32, 1, options.classes), classes=options.classes)


BLOBS_MLP = Workload(
    name="blobs-mlp", dataset="Gaussian blobs (generated)", model="MLP features-32-classes",
    summary="an out-of-tree example workload", build=build,
    budget=Budget(max_epochs=3, eval_every_epochs=1, target_accuracy=0.9),
    hyperparameters={"batch_size": 32, "lr": 0.05}, Options=BlobsOptions)
