"""Emulated device memory: a rank's bytes by kind (planned before the first step, measured while training), the
autograd counter that measures activations, and the budget check (`memory_per_rank`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from harness.bytesize import format_bytes

#: Steps whose held bytes a method without per-step records measures (FirstSteps): shapes do not change after the
#: first, and the saved-tensor hooks cost a little on every step they watch.
MEASURED_STEPS = 3


@dataclass
class MemoryBytes:
    """Bytes by kind (KINDS). A plan gives each kind's peak; a measurement each kind's peak over the run, so the
    total is the sum of the kinds' peaks (an upper bound of what was held at any one moment, as PipeDream's planner
    adds weights, stashes and activations)."""

    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    versions: int = 0
    activations: int = 0
    buffers: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, kind) for kind in KINDS)

    def __add__(self, other: MemoryBytes) -> MemoryBytes:
        return MemoryBytes(*(getattr(self, k) + getattr(other, k) for k in KINDS))

    def peak(self, other: MemoryBytes) -> MemoryBytes:
        """Each kind's larger value."""
        return MemoryBytes(*(max(getattr(self, k), getattr(other, k)) for k in KINDS))

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> MemoryBytes:
        return cls(*(int(row.get(k, 0)) for k in KINDS))

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor([getattr(self, k) for k in KINDS], dtype=torch.int64)

    @classmethod
    def from_tensor(cls, row: torch.Tensor) -> MemoryBytes:
        return cls(*(int(v) for v in row.tolist()))

    def describe(self) -> str:
        """The non-zero kinds, largest first: 'weights 3.2 MB, activations 1.1 MB'."""
        parts = sorted((k for k in KINDS if getattr(self, k)), key=lambda k: -getattr(self, k))  # stable: KINDS order
        return ", ".join(f"{k} {format_bytes(getattr(self, k))}" for k in parts)


#: What a rank holds, by kind. weights: parameters and buffers; gradients: the parameters' .grad; optimizer: its
#: state (momentum, Adam's moments and steps); versions: weight versions kept besides the live ones (stashes,
#: predictions, double buffers); activations: what autograd keeps for backwards still to run, at their peak;
#: buffers: communication and compression state (DDP's gradient buckets, error-feedback residuals, DGC's momenta,
#: PowerSGD's error and factors).
KINDS = tuple(f.name for f in fields(MemoryBytes))


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Storage bytes of the tensors, each storage counted once (views and aliases share theirs)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def state_tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure of dicts, lists and tuples (an optimizer's or a compressor's state)."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, Mapping):
        return [t for v in state.values() for t in state_tensors(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in state_tensors(v)]
    return []


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Measured: the bytes of the optimizer's state tensors."""
    return tensor_bytes(state_tensors(list(optimizer.state.values())))


def planned_optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Planned, before any step: the state the optimizer will create. SGD: a momentum buffer per parameter when
    momentum > 0; Adam and AdamW: two moments per parameter and a step counter (a 4-byte tensor) each."""
    total = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            size = p.numel() * p.element_size()
            if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
                total += 2 * size + 4
            elif group.get("momentum", 0.0):
                total += size
    return total


def weight_bytes(modules: Iterable[torch.nn.Module]) -> int:
    """Parameters and buffers of the modules (each storage once)."""
    return tensor_bytes(t for m in modules for t in (*m.parameters(), *m.buffers()))


def gradient_bytes(modules: Iterable[torch.nn.Module]) -> int:
    """Planned: one gradient per trainable parameter."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for m in modules for p in m.parameters()
                                                     if p.requires_grad}.values())


def saved_bytes(tensor: torch.Tensor) -> int:
    """The bytes a saved tensor stands for: its own elements when it is a slice of a larger storage (a microbatch
    cut from its minibatch), else its storage's."""
    return min(tensor.untyped_storage().nbytes(), tensor.numel() * tensor.element_size())


class _Held:
    """What a saved-tensor hook keeps in place of a tensor: the tensor, and a release of its bytes when autograd
    frees the saved value (this object's last reference)."""

    __slots__ = ("tensor", "counter", "key")

    def __init__(self, tensor: torch.Tensor, counter: SavedTensors, key: int):
        self.tensor, self.counter, self.key = tensor, counter, key

    def __del__(self) -> None:
        self.counter.release(self.key)


class SavedTensors:
    """A context whose autograd saved-tensor hooks measure the bytes kept for backwards: `live` now and `peak`
    since the start (or the last `reset`), each storage counted once, the storages in `exclude` (the weights, held
    anyway) never. A saved value is released when autograd frees it (after its backward, or with its graph)."""

    def __init__(self, exclude: Iterable[int] = ()):
        self.exclude = set(exclude)
        self.live = self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage pointer -> [saved values holding it, its bytes]
        self.touched: set[int] = set()  # excluded storages that were saved
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> Any:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.exclude:
            self.touched.add(key)
            return tensor
        entry = self._refs.get(key)
        if entry is None:
            entry = self._refs[key] = [0, saved_bytes(tensor)]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Held(tensor, self, key)

    @staticmethod
    def _unpack(held: Any) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    def release(self, key: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]

    def keys(self) -> set[int]:
        """The storages saved and not yet released."""
        return set(self._refs)

    def reset(self) -> None:
        self.peak = self.live

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


class FirstSteps:
    """What a method holds on its first MEASURED_STEPS steps, measured, each kind at its peak: autograd's saved
    tensors of the step's forwards and backwards (inside `watch`) and the gradients before the update (`record`)."""

    def __init__(self) -> None:
        self.steps = 0
        self.held = MemoryBytes()
        self._saved: SavedTensors | None = None

    def watch(self, modules: Iterable[torch.nn.Module]) -> contextlib.AbstractContextManager:
        """The context around a step's forwards and backwards: the saved-tensor counter (the modules' weights
        excluded) while steps are measured, else nothing."""
        self._saved = SavedTensors(storages(modules)) if self.steps < MEASURED_STEPS else None
        return self._saved if self._saved is not None else contextlib.nullcontext()

    def record(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """After the backward, before the update: the gradients' bytes and the step's peak of saved bytes."""
        if self._saved is None:
            return
        self.steps += 1
        self.held = self.held.peak(MemoryBytes(gradients=tensor_bytes(p.grad for p in parameters),
                                               activations=self._saved.peak))
        self._saved = None


def storages(modules: Iterable[torch.nn.Module]) -> set[int]:
    """The storage pointers of the modules' parameters and buffers (for SavedTensors' `exclude`)."""
    return {t.untyped_storage().data_ptr() for m in modules for t in (*m.parameters(), *m.buffers())}


def refusal(plans: Mapping[int, MemoryBytes], budget: int) -> str | None:
    """None when every rank's plan fits `budget` bytes, else one line naming the rank that needs the most."""
    rank, plan = max(plans.items(), key=lambda item: (item[1].total, -item[0]))
    if plan.total <= budget:
        return None
    return (f"does not fit: rank {rank} needs {format_bytes(plan.total)} > memory_per_rank {format_bytes(budget)} "
            f"({plan.describe()})")


@dataclass(frozen=True)
class Footprint:
    """One block of a chain, profiled on a microbatch: the bytes autograd saves for its backward besides its input
    (its weights excluded), whether it saves its input and its output, and their bytes."""

    saved_bytes: int
    saves_input: bool
    saves_output: bool
    input_bytes: int
    output_bytes: int


class LossBlock(torch.nn.Module):
    """The loss as the chain's last block (its saved tensors count: a cross-entropy keeps its log-probabilities)."""

    def __init__(self, loss_fn: Any, targets: torch.Tensor):
        super().__init__()
        self.loss_fn, self.targets = loss_fn, targets

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(h, self.targets)


def footprints(blocks: Iterable[torch.nn.Module], example: torch.Tensor, detach_inputs: bool = False
               ) -> list[Footprint]:
    """Each block's Footprint on `example` fed through the chain (one forward with autograd on, no backward). With
    `detach_inputs` every block after the first starts from a detached input that requires grad, as a pipeline
    stage receives it. Weights, buffers (BatchNorm's statistics) and the RNG (dropout) are as they were on return."""
    blocks = list(blocks)
    devices = [example.device.index or 0] if example.is_cuda else []
    saved = [[b.detach().clone() for b in block.buffers()] for block in blocks]
    out: list[Footprint] = []
    graph = []  # every block's output, kept until the end: a block's saved tensors stay alive as in a training step
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            x = example
            for index, block in enumerate(blocks):
                if index and detach_inputs and x.is_floating_point():
                    x = x.detach().requires_grad_(True)
                entry = x.untyped_storage().data_ptr()
                counter = SavedTensors(exclude=storages([block]) | {entry})
                with counter:
                    y = block(x)
                exit_ = y.untyped_storage().data_ptr()
                out.append(Footprint(counter.peak, entry in counter.touched, exit_ in counter.keys(),
                                     saved_bytes(x), saved_bytes(y)))
                graph.append((counter, y))
                x = y
    finally:
        with torch.no_grad():
            for block, values in zip(blocks, saved, strict=True):
                for buffer, value in zip(block.buffers(), values, strict=True):
                    buffer.copy_(value)
    return out


def chain_saved_bytes(prints: list[Footprint], start: int, end: int) -> int:
    """The bytes blocks [start, end) of a profiled chain save for one microbatch's backward, run as one module: each
    block's own, its input where it saves it, a storage two neighbours both save counted once."""
    total = 0
    for i in range(start, end):
        p = prints[i]
        total += p.saved_bytes
        if p.saves_input and (i == start or not prints[i - 1].saves_output):
            total += p.input_bytes
    return total


class DoesNotFit(Exception):
    """A run that cannot be placed in its memory_per_rank: raised before the first step (a planner that finds no
    plan that fits), reported as the run's state `does_not_fit` with this one line, not as a crash."""
