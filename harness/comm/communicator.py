"""The communicator: the one layer methods talk through; it counts bytes and time per category where they are sent."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from harness.comm.ring import ring_all_gather_bytes, ring_all_reduce_bytes

CATEGORIES = ("gradients", "activations", "activation_grads", "gradient_sync", "params", "grad_norm", "control",
              "eval")
TRAINING_CATEGORIES = ("gradients", "activations", "activation_grads", "gradient_sync", "params", "grad_norm")


def _all_gather_single(output: torch.Tensor, tensor: torch.Tensor, **kwargs: Any) -> Any:
    """torch's flat all-gather under its current name: all_gather_single (torch >= 2.14 warns that
    all_gather_into_tensor, the older name of the same collective, is deprecated)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, **kwargs)


@dataclass
class Ledger:
    """Cumulative bytes, seconds and call counts per category for one rank."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    recv: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, category: str, sent: int, recv: int) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown communication category {category!r} (known: {', '.join(CATEGORIES)})")
        self.sent[category] += sent
        self.recv[category] += recv
        self.calls[category] += 1

    def training_bytes(self) -> tuple[int, int]:
        return (sum(self.sent[c] for c in TRAINING_CATEGORIES), sum(self.recv[c] for c in TRAINING_CATEGORIES))

    def by_category(self) -> dict[str, list[int]]:
        return {c: [self.sent[c], self.recv[c]] for c in CATEGORIES if self.sent[c] or self.recv[c]}

    def state_dict(self) -> dict[str, Any]:
        return {"sent": dict(self.sent), "recv": dict(self.recv), "seconds": dict(self.seconds),
                "calls": dict(self.calls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("sent", "recv", "seconds", "calls"):
            getattr(self, name).clear()
            getattr(self, name).update(state[name])


class Communicator:
    """Wraps torch.distributed collectives and point-to-point calls for one rank, with accounting.

    Every call names a category (see CATEGORIES). Bytes follow the rules in docs/results.md: P2P counts the tensor's
    bytes; collectives count what the textbook ring algorithm moves per rank. Synchronous calls are timed; the time of
    an asynchronous call is measured from its launch until its future completes.
    """

    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None = None):
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.ledger = Ledger()

    def subgroup(self, ranks: list[int]) -> Communicator | None:
        """A communicator over `ranks` (global ranks, in order) sharing this one's ledger, or None on a rank outside
        it. Collective: every rank of this communicator calls it with the same `ranks`, in the same order."""
        group = dist.new_group(sorted(ranks)) if self.world_size > 1 else None
        if self.rank not in ranks:
            return None
        sub = Communicator(sorted(ranks).index(self.rank), len(ranks), group)
        sub.ledger = self.ledger
        return sub

    # -- accounting ---------------------------------------------------------------------------------------------
    def count(self, category: str, sent: int, recv: int) -> None:
        """Record bytes for a transfer done outside this class (for example by a DDP hook's future)."""
        self.ledger.add(category, sent, recv)

    def _timed(self, category: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = fn()
        self.ledger.seconds[category] += time.perf_counter() - start
        return out

    def _track_future(self, category: str, fut: torch.futures.Future, start: float) -> torch.futures.Future:
        def done(f: torch.futures.Future) -> Any:
            self.ledger.seconds[category] += time.perf_counter() - start
            value = f.value()
            return value[0] if isinstance(value, list) else value

        return fut.then(done)

    # -- collectives --------------------------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, category: str, op: dist.ReduceOp = dist.ReduceOp.SUM,
                   async_op: bool = False) -> Any:
        """In-place all-reduce. Calls the process group directly (as torch's own DDP hooks do), skipping the
        Python wrapper of dist.all_reduce: on a tiny model its overhead shows in the step time."""
        n = ring_all_reduce_bytes(tensor.numel() * tensor.element_size(), self.world_size)
        self.ledger.add(category, n, n)
        if self.world_size == 1:
            return _done_future(tensor) if async_op else None
        options = dist.AllreduceOptions()
        options.reduceOp = op
        group = self.group or dist.group.WORLD
        start = time.perf_counter()
        work = group.allreduce([tensor], options)
        if async_op:
            return self._track_future(category, work.get_future(), start)
        work.wait()
        self.ledger.seconds[category] += time.perf_counter() - start
        return None

    def all_gather(self, tensor: torch.Tensor, category: str) -> list[torch.Tensor]:
        """Gather equal-sized tensors from every rank (gloo cannot gather unequal sizes: pad first)."""
        n = ring_all_gather_bytes(tensor.numel() * tensor.element_size(), self.world_size)
        self.ledger.add(category, n, n)
        if self.world_size == 1:
            return [tensor.clone()]
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._timed(category, lambda: dist.all_gather(out, tensor, group=self.group))
        return out

    def all_gather_into(self, output: torch.Tensor, tensor: torch.Tensor, category: str,
                        async_op: bool = False) -> Any:
        """Gather equal-sized `tensor`s into the flat `output` (W * numel), optionally asynchronously."""
        n = ring_all_gather_bytes(tensor.numel() * tensor.element_size(), self.world_size)
        self.ledger.add(category, n, n)
        if self.world_size == 1:
            output.copy_(tensor.reshape(output.shape))
            return _done_future(output) if async_op else None
        if async_op:
            start = time.perf_counter()
            work = _all_gather_single(output, tensor, group=self.group, async_op=True)
            return self._track_future(category, work.get_future(), start)
        return self._timed(category, lambda: _all_gather_single(output, tensor, group=self.group))

    def broadcast(self, tensor: torch.Tensor, src: int, category: str) -> None:
        n = tensor.numel() * tensor.element_size()
        if self.rank == src:
            self.ledger.add(category, (self.world_size - 1) * n, 0)
        else:
            self.ledger.add(category, 0, n)
        if self.world_size > 1:
            self._timed(category, lambda: dist.broadcast(tensor, src=src, group=self.group))

    def barrier(self) -> None:
        if self.world_size > 1:
            self._timed("control", lambda: dist.barrier(group=self.group))

    # -- point to point -----------------------------------------------------------------------------------------
    # `tag` separates independent streams between the same two ranks (for example training and evaluation).
    def send(self, tensor: torch.Tensor, dst: int, category: str, tag: int = 0) -> None:
        self.ledger.add(category, tensor.numel() * tensor.element_size(), 0)
        self._timed(category, lambda: dist.send(tensor, dst=dst, group=self.group, tag=tag))

    def recv(self, tensor: torch.Tensor, src: int, category: str, tag: int = 0) -> None:
        self.ledger.add(category, 0, tensor.numel() * tensor.element_size())
        self._timed(category, lambda: dist.recv(tensor, src=src, group=self.group, tag=tag))

    def isend(self, tensor: torch.Tensor, dst: int, category: str, tag: int = 0) -> dist.Work:
        self.ledger.add(category, tensor.numel() * tensor.element_size(), 0)
        return dist.isend(tensor, dst=dst, group=self.group, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, category: str, tag: int = 0) -> dist.Work:
        self.ledger.add(category, 0, tensor.numel() * tensor.element_size())
        return dist.irecv(tensor, src=src, group=self.group, tag=tag)

    # -- DDP ----------------------------------------------------------------------------------------------------
    def allreduce_hook(self, _state, bucket):  # no annotations: DDP checks them literally, strings fail
        """A DDP communication hook (dist.GradBucket -> Future[Tensor]): average the bucket by all-reduce,
        counted as `gradients`. Same numerics as DDP's built-in all-reduce (divide by world size, then sum).
        """
        buffer = bucket.buffer()
        buffer.div_(self.world_size)
        return self.all_reduce(buffer, "gradients", async_op=True)


def _done_future(value: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return fut
