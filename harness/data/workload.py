"""What a workload is: a name bound to a dataset, a model factory, a loss, default hyperparameters and a budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from harness.data.tensors import TensorData
from harness.suite.spec import Budget


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
    classes: int = 10


@dataclass(frozen=True)
class Workload:
    """A registered workload. `build(options, data_root)` makes the Instance of one run; `Options` validates the
    suite's `workload_options`; `budget` and `hyperparameters` are defaults a suite may override."""

    name: str
    dataset: str
    model: str
    summary: str
    build: Callable[[Any, str | None], Instance]
    budget: Budget
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    Options: type[BaseModel] = NoOptions

    @property
    def target(self) -> float | None:
        return self.budget.target_accuracy

    def instantiate(self, options: dict[str, Any] | None = None, data_root: str | None = None) -> Instance:
        return self.build(self.Options.model_validate(options or {}), data_root)
