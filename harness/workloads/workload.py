"""What a workload is: a name bound to a dataset, a model factory, a loss, default hyperparameters and a budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.overrides import TorchFunctionMode

from harness.budget import Budget
from harness.data.tensors import TensorData


class NoOptions(BaseModel):
    """A workload without options (any key is an error)."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class Instance:
    """A workload made concrete for one run: data, a model factory and the loss."""

    train: TensorData
    test: TensorData
    make_model: Callable[[], nn.Sequential]
    loss: Callable[..., torch.Tensor] = nn.functional.cross_entropy
    classes: int = 10  # outputs per prediction: classes, or a language model's vocabulary
    provenance: dict[str, Any] | None = None  # where the data came from (hashes, files), for manifest.json


@dataclass(frozen=True)
class Workload:
    """A registered workload. `build(options, data_root)` makes the Instance of one run; `Options` validates the
    suite's `workload_options`; `budget` and `hyperparameters` are defaults a suite may override. `make_model(options)`,
    optional, is the model alone, without data: validation builds it on the meta device to check what methods ask of
    its blocks (a pipeline's stages, local's chunks) before a run starts; without it those checks wait for the run.
    `train_samples(options)`, optional, is the training set's size known without loading the data: validation
    refuses a global batch larger than it (without it, or where it gives None, the run's data loader does)."""

    name: str
    dataset: str
    model: str
    summary: str
    build: Callable[[Any, str | None], Instance]
    budget: Budget
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    Options: type[BaseModel] = NoOptions
    make_model: Callable[[Any], nn.Sequential] | None = None
    train_samples: Callable[[Any], int | None] | None = None

    @property
    def target(self) -> float | None:
        return self.budget.target_accuracy

    @property
    def target_text(self) -> str:
        """The budget's target in words: 'target 0.95', 'target loss 2.00', or 'no target'."""
        if self.budget.target_accuracy is not None:
            return f"target {self.budget.target_accuracy:.2f}"
        if self.budget.target_loss is not None:
            return f"target loss {self.budget.target_loss:.2f}"
        return "no target"

    def instantiate(self, options: dict[str, Any] | None = None, data_root: str | None = None) -> Instance:
        return self.build(self.Options.model_validate(options or {}), data_root)

    def training_samples(self, options: dict[str, Any] | None = None) -> int | None:
        """The training set's size for `options` when known without loading the data, else None."""
        if self.train_samples is None:
            return None
        return self.train_samples(self.Options.model_validate(options or {}))

    def meta_model(self, options: dict[str, Any] | None = None) -> nn.Sequential | None:
        """The model for `options` on the meta device (its blocks and layers, no storage, no data), or None when the
        workload gives no `make_model`. Raises ValueError when the options make no model."""
        if self.make_model is None:
            return None
        with torch.device("meta"), _SkipNormalFill():
            return self.make_model(self.Options.model_validate(options or {}))


class _SkipNormalFill(TorchFunctionMode):
    """Meta tensors hold no values, so an in-place normal_ fill (nn.init's Kaiming and Xavier normals) on one is
    skipped: torch routes it through a Python reference that imports torch._dynamo, a second of validation time."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.normal_ and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return args[0]
        return func(*args, **(kwargs or {}))
