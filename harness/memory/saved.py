"""Autograd's saved tensors, counted by hooks: SavedTensors (live and peak bytes) and FirstSteps (a method's first
steps, measured)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from harness.memory.count import storages, tensor_bytes
from harness.memory.kinds import MEASURED_STEPS, MemoryBytes


def saved_bytes(tensor: torch.Tensor) -> int:
    """The bytes a saved tensor stands for: the span of its storage it reaches, from its first element to its last
    (a view keeps its whole storage alive, so q, k and v split from one qkv projection stand for nearly all of it),
    which is its own elements when it is a contiguous slice of a larger storage (a microbatch cut from its
    minibatch), at most its storage's."""
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return min(tensor.untyped_storage().nbytes(), (last + 1) * tensor.element_size())


class _Held:
    """What a saved-tensor hook keeps in place of a tensor: the tensor, and a release of its bytes when autograd
    frees the saved value (this object's last reference)."""

    __slots__ = ("tensor", "counter", "key", "__weakref__")

    def __init__(self, tensor: torch.Tensor, counter: SavedTensors, key: int):
        self.tensor, self.counter, self.key = tensor, counter, key

    def __del__(self) -> None:
        self.counter.release(self.key)


class SavedTensors:
    """A context whose autograd saved-tensor hooks measure the bytes kept for backwards: `live` now and `peak`
    since the start (or the last `reset`), each storage counted once, the storages in `exclude` (the weights, held
    anyway) never. A saved value is released when autograd frees it (after its backward, or with its graph).

    A graph that never runs its backward (a profile) must be `drop`ped: a block that saves its own output holds
    it through the hook's value, a cycle through autograd's C++ nodes that Python's collector cannot see, so the
    graph and every tensor it saved would outlive the profile."""

    def __init__(self, exclude: Iterable[int] = ()):
        self.exclude = set(exclude)
        self.live = self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage pointer -> [saved values holding it, its bytes]
        self.touched: set[int] = set()  # excluded storages that were saved
        self._values: list[weakref.ref[_Held]] = []  # the hook's values, for `drop`
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
        held = _Held(tensor, self, key)
        self._values.append(weakref.ref(held))
        return held

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

    def drop(self) -> None:
        """Let go of every tensor the hook's values still hold (their graph can no longer run its backward)."""
        for ref in self._values:
            held = ref()
            if held is not None:
                held.tensor = None
        self._values.clear()

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
