"""A bounded forward channel between two ranks: activations and their sample ids flow on, credits flow back."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from harness.comm.communicator import Communicator
from harness.comm.tags import Tag

#: Credits a Receiver keeps once sent (at each recv it waits for older ones' sends to finish and lets them go).
KEPT_CREDITS = 8


@dataclass
class ChannelStats:
    """Producer-side counters: seconds blocked on a full queue, and the most messages ever in flight."""

    wait_s: float = 0.0
    max_in_flight: int = 0


class Sender:
    """The producer end. `send(tensor, ids)` returns at once unless `depth` messages are already in flight (sent but
    not yet taken by the consumer); then it blocks until the consumer's credit for the oldest arrives. Credits are
    one int64 per message (category `control`); tensors and ids count as `activations`."""

    def __init__(self, comm: Communicator, dst: int, depth: int):
        if depth < 1:
            raise ValueError(f"queue depth must be at least 1, got {depth}")
        self.comm, self.dst, self.depth = comm, dst, depth
        self.sent = 0
        self._pending: deque[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]] = deque()
        self.stats = ChannelStats()

    def in_flight(self) -> int:
        return len(self._pending)

    def held(self, ids: bool = True) -> list[torch.Tensor]:
        """The tensors kept for the messages in flight: each one's tensor, awaited credit and (with `ids`) ids."""
        return [t for tensor, sent, credit, _ in self._pending for t in (tensor, credit, *([sent] if ids else []))]

    def send(self, tensor: torch.Tensor, ids: torch.Tensor) -> None:
        while len(self._pending) >= self.depth:
            start = time.perf_counter()
            self._retire_oldest()
            self.stats.wait_s += time.perf_counter() - start
        tensor, ids = tensor.detach().contiguous(), ids.contiguous()
        credit = torch.empty(1, dtype=torch.int64)
        works = [self.comm.isend(tensor, self.dst, "activations", Tag.CHANNEL_DATA),
                 self.comm.isend(ids, self.dst, "activations", Tag.CHANNEL_IDS),
                 self.comm.irecv(credit, self.dst, "control", Tag.CHANNEL_CREDIT)]
        self._pending.append((tensor, ids, credit, works))  # buffers stay alive until the credit is back
        self.sent += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self._pending))

    def _retire_oldest(self) -> None:
        _, _, credit, works = self._pending.popleft()
        for work in works:
            work.wait()
        expected = self.sent - len(self._pending) - 1
        if int(credit) != expected:
            raise RuntimeError(f"rank {self.comm.rank}: credit {int(credit)} for message {expected}: the channel to "
                               f"rank {self.dst} is out of order")

    def drain(self) -> None:
        """Wait until the consumer has taken every message sent."""
        while self._pending:
            self._retire_oldest()


class Receiver:
    """The consumer end: `recv()` blocks for the next message and returns (tensor, ids), then sends its credit."""

    def __init__(self, comm: Communicator, src: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
        self.comm, self.src, self.shape, self.dtype = comm, src, shape, dtype
        self.received = 0
        self._credits: deque[tuple[torch.Tensor, object]] = deque()

    def recv(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        tensor = torch.empty((batch, *self.shape), dtype=self.dtype)
        ids = torch.empty(batch, dtype=torch.int64)
        self.comm.recv(tensor, self.src, "activations", Tag.CHANNEL_DATA)
        self.comm.recv(ids, self.src, "activations", Tag.CHANNEL_IDS)
        credit = torch.tensor([self.received], dtype=torch.int64)
        self._credits.append((credit, self.comm.isend(credit, self.src, "control", Tag.CHANNEL_CREDIT)))
        self.received += 1
        # Credit i's receive was posted by the sender with message i, long before: waiting on it is prompt. Not
        # is_completed(): gloo's send work reports False until waited on, so the credits were never let go.
        while len(self._credits) > KEPT_CREDITS:
            self._credits.popleft()[1].wait()
        return tensor, ids

    def held(self) -> list[torch.Tensor]:
        """The credits kept (sent, or still being sent): the last KEPT_CREDITS."""
        return [credit for credit, _ in self._credits]

    def drain(self) -> None:
        while self._credits:
            self._credits.popleft()[1].wait()
