"""The train clock: wall time, and train time that excludes evaluation and checkpointing the same way for all."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class TrainClock:
    """Wall time since the process started the run, and train time: time since `start_training()` minus the
    intervals spent in `excluded()` blocks (evaluation, checkpointing). Set-up (imports, data, model) is not train
    time for any method. A resumed run starts both clocks at its checkpoint's readings (the offsets)."""

    def __init__(self, offset_train_s: float = 0.0, offset_wall_s: float = 0.0) -> None:
        self.start = time.perf_counter() - offset_wall_s
        self.train_start: float | None = None
        self.offset = offset_train_s
        self.excluded_s = 0.0
        self._paused_at: float | None = None

    def start_training(self) -> None:
        self.train_start = time.perf_counter()

    def wall(self) -> float:
        return time.perf_counter() - self.start

    def train(self) -> float:
        if self.train_start is None:
            return self.offset
        now = self._paused_at if self._paused_at is not None else time.perf_counter()
        return now - self.train_start - self.excluded_s + self.offset

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Time inside this block (evaluation, checkpointing) does not count as train time."""
        if self._paused_at is not None:  # nested: the outer block already excludes it
            yield
            return
        self._paused_at = time.perf_counter()
        try:
            yield
        finally:
            self.excluded_s += time.perf_counter() - self._paused_at
            self._paused_at = None
