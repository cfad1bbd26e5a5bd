"""What a DDP comm hook's collectives and callbacks hold, let go of on the main thread after the backward."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

#: How many times `release` yields to gloo's thread for one tensor before it lets go anyway (the free is then the
#: thread's, which the meter may miss; it never waits forever on a reference it cannot account for).
MAX_YIELDS = 200_000


def _storage_refs(tensor: torch.Tensor) -> int:
    """How many tensors (TensorImpls) hold `tensor`'s storage (`untyped_storage()` holds it once while asked)."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) - 1


class Retired:
    """A step's hook state, held until the main thread lets go of it after DDP's backward has returned.

    Why: a comm hook's future callbacks run on gloo's worker thread, and that thread holds the last references to
    what the callback chain kept (the callbacks and their closures; the collective's Work, its future and the
    input and output tensors in them) and lets them go there, after the callbacks return and outside the
    profiler's thread-local scope: the allocator's meter (harness/memory/peak.py) sees those tensors allocated and
    never freed, and a rank's peak grows step by step. So a hook keeps its tensors in `bags` (dicts its callbacks
    read them from, never closure variables: a callback object dropped on gloo's thread then holds only a bag) and
    names the tensors a collective was handed (`sent`). `release` first waits until gloo's thread has let go of
    each sent tensor (it does, just after the callbacks return; the wait yields the GIL to it), then empties the
    bags: every last reference, and so every free, is the main thread's. What the hook computes and sends, and
    when, is unchanged. DDP waits for every bucket's future before its backward returns, so nothing here is in
    use when it is released.

    What it costs: with one DDP bucket (the models of suites/memory-allocator.toml) the payloads die at the end of
    the backward either way; with several, every bucket's payloads live until the backward's end, not each until
    its own callback ends: the plans count all buckets' hook bytes at once.
    """

    def __init__(self) -> None:
        self._bags: list[dict[str, Any]] = []
        self._sent: list[torch.Tensor] = []

    def bag(self, **objects: Any) -> dict[str, Any]:
        """A dict of these objects for a hook's callbacks to read from, held until `release`."""
        bag = dict(objects)
        self._bags.append(bag)
        return bag

    def sent(self, *tensors: torch.Tensor) -> None:
        """Tensors handed to a collective (held by its Work and future until gloo's worker drops them): `release`
        waits for that before it lets go of them. Each must be its own storage's only tensor here."""
        self._sent.extend(tensors)

    def release(self) -> None:
        """Let go of everything held, on this thread, once gloo's thread has let go of the sent tensors. Call on the
        main thread after DDP's backward has returned (its futures are complete)."""
        sent, self._sent = self._sent, []
        while sent:
            tensor = sent.pop()
            # Held here only: by this frame's name and getrefcount's argument and the bags (Python references: a
            # callback's future holds the tensor object itself), by no other TensorImpl reference (a Work's inputs
            # and outputs, a c10d future's value) and no other tensor on its storage (_allgather_base's chunks).
            ours = 2 + sum(value is tensor for bag in self._bags for value in bag.values())
            for _ in range(MAX_YIELDS):
                if sys.getrefcount(tensor) == ours and tensor._use_count() == 1 and _storage_refs(tensor) == 1:
                    break
                time.sleep(0)  # lets gloo's thread take the GIL and finish dropping its references
            del tensor
        bags, self._bags = self._bags, []
        for bag in bags:
            bag.clear()

    def __len__(self) -> int:
        return len(self._bags) + len(self._sent)


class ReleasedAfterBackward:
    """For a DDP method whose comm hook keeps its state in `self.retired`: the forward and backward as the method's
    own, then that state let go of on this (the main) thread, before the update."""

    retired: Retired

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = super().forward_backward(x, y)  # type: ignore[misc]
        self.retired.release()
        return loss
