"""The contract between the runner and a method: parameters, run context, step and eval results, and the base class."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.data.tensors import Batch, TensorData
from harness.memory import MemoryBytes
from harness.params import TrainParams  # noqa: F401 (re-exported: methods import it from here)
from harness.trace import StepSchedule
from harness.workloads.workload import Instance


@dataclass
class RunContext:
    """What the runner hands a method on every rank."""

    rank: int
    world_size: int
    device: torch.device
    workload: Instance
    params: Any  # an instance of the method's Params
    comm: Communicator
    seed: int
    run_dir: Path
    log: Any = None  # callable(kind: str, **fields): append a record of a method-specific kind to metrics.jsonl
    memory_per_rank: int | None = None  # the emulated device memory of each rank (bytes), for planners that fit it


@dataclass
class StepStats:
    """What one train_step reports: this rank's loss on the step (None on a rank that computes no loss, such as a
    pipeline stage before the last), and any method-specific numbers."""

    loss: float | None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalResult:
    """Global evaluation numbers over the whole test set (valid on rank 0; other ranks may return them too)."""

    accuracy: float
    loss: float
    extra: dict[str, Any] = field(default_factory=dict)


class Method(abc.ABC):
    """A training method, run collectively by every rank of a run.

    The runner owns budgets, evaluation cadence, clocks, checkpoints and status; the method owns the algorithm.
    Subclasses set the class attributes, define `Params` (a TrainParams subclass) for their hyperparameters, and
    implement `train_step` and `evaluate`. See docs/methods-api.md.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type[TrainParams]] = TrainParams
    min_world_size: ClassVar[int] = 1
    max_world_size: ClassVar[int | None] = None

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    @classmethod
    def check_world_size(cls, world_size: int, params: TrainParams) -> str | None:
        """None if the method can run on `world_size` ranks with `params`, else the reason in one line."""
        if world_size < cls.min_world_size:
            return f"method {cls.name!r} needs at least {cls.min_world_size} ranks, got {world_size}"
        if cls.max_world_size is not None and world_size > cls.max_world_size:
            return f"method {cls.name!r} runs on at most {cls.max_world_size} rank(s), got {world_size}"
        return None

    @classmethod
    def batch_split(cls, world_size: int, params: TrainParams) -> tuple[int, str, str] | None:
        """How the method cuts a step's global batch, for validation to refuse a cut that leaves a part without a
        sample: (parts, the parameter to name when batch_size is smaller, what the parts are in words), e.g. DDP's
        (world_size, 'batch_size', 'data-parallel shards, one per rank'). Default None: every part of the method
        sees the whole batch (or one microbatch of it at a time)."""
        return None

    @classmethod
    def check_model(cls, world_size: int, params: TrainParams, model: Callable[[], nn.Sequential]
                    ) -> tuple[str, str] | None:
        """None if the method can cut the workload's model as `params` and `world_size` ask, else (the field that
        asks too much: 'world_size' or a parameter's name, the reason in one line). `model()` builds the model on
        the meta device (blocks and layers, no storage, no data); suite validation calls this after
        check_world_size, for workloads that give a model without data. Default: no requirement."""
        return None

    @classmethod
    def step_schedule(cls, stages: int, microbatches: int) -> StepSchedule | None:
        """A pipeline's steady-state step at `stages` stages (one per rank) and `microbatches` microbatches, the very
        actions its executor runs, for `dtbench project` to simulate at shapes no run had. Default None: the method
        has no schedule the projection can re-shape."""
        return None

    @classmethod
    def steady_from(cls, world_size: int, params: TrainParams) -> int:
        """The first step (1-based) of the method's steady state: where the allocator's measured window opens
        (harness/memory/peak.py AllocatorPeak's `first`; the run records it as `first_step`). Default 2: the step after
        the first, which creates optimizer state and torch's caches. A method whose steps reach their steady state
        later (Pipelined Backpropagation's pipeline fills one tick a step) names the first step of it."""
        return 2

    def memory_plan(self) -> dict[int, MemoryBytes] | None:
        """The bytes each rank this process runs (every emulated rank in a virtual mode) will hold at its peak,
        computed before the first step from the method's own structures (harness/memory/kinds.py's kinds: weights,
        gradients, optimizer state, weight versions, the activations its schedule holds at its peak, communication
        and compression buffers). The runner records it for every run and refuses a run whose plan exceeds
        `memory_per_rank` before its first step. Default None: the method plans nothing, and a budget refuses it."""
        return None

    def memory_held(self) -> dict[int, MemoryBytes] | None:
        """The same kinds measured while training (each at its peak so far), per rank this process runs: what the
        plan is checked against. Default None: not measured."""
        return None

    @abc.abstractmethod
    def train_step(self, batch: Batch) -> StepStats:
        """One optimizer step on the global batch `batch` (each rank loads the part it needs)."""

    @abc.abstractmethod
    def evaluate(self, test: TensorData) -> EvalResult | None:
        """Accuracy and loss on the whole test set. Collective; rank 0 must return the global result."""

    @property
    def checkpointable(self) -> bool:
        """Whether state_dict/load_state_dict capture everything a run needs to resume exactly after a step
        (by default: whether the subclass implements them). The runner does not checkpoint other methods."""
        return type(self).state_dict is not Method.state_dict

    def state_dict(self) -> dict[str, Any]:
        """This rank's state after a step: model, optimizer, method memories. Tensors, dicts, lists, numbers and
        strings only (checkpoints load with weights_only=True). RNG streams and bytes are the runner's."""
        raise NotImplementedError(f"method {self.name!r} does not support checkpoints")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"method {self.name!r} does not support checkpoints")

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """This rank's optimizers: the runner sets the lr of each of their param groups before every step (base lr
        times the schedule's factor, harness/run/lr_schedule.py). Default: none, which only a constant schedule
        allows."""
        return []

    def end_training(self) -> None:
        """Called once after the last train_step, before the final evaluation, with the train clock running. A method
        with work in flight (an asynchronous pipeline's minibatches) completes it here (default: nothing)."""
        return None

    def finish(self) -> None:
        """Release resources at the end of a run (default: nothing)."""
        return None
