"""Writing a run's files: the train clock, metrics.jsonl records, and atomic spec/status/manifest JSON."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


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


def _clean(value: Any) -> Any:
    """JSON has no NaN or inf: write them as strings so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


_ENCODER = json.JSONEncoder(allow_nan=False, separators=(", ", ": "))


class MetricsWriter:
    """Appends one JSON object per line to metrics.jsonl; each line is one write(2) on an O_APPEND descriptor,
    so the ranks of a run can share the file without interleaving inside a line."""

    def __init__(self, path: Path, rank: int, clock: TrainClock):
        self.path = path
        self.rank = rank
        self.clock = clock
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, kind: str, **fields: Any) -> None:
        record = {"kind": kind, "rank": self.rank, "wall_time_s": round(self.clock.wall(), 6),
                  "train_time_s": round(self.clock.train(), 6), **fields}
        try:
            line = _ENCODER.encode(record)
        except ValueError:  # a NaN or inf somewhere: the slow path spells them as strings
            line = _ENCODER.encode(_clean(record))
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file, then rename), so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_status(run_dir: Path, state: str, error: dict[str, Any] | None = None,
                 final: dict[str, Any] | None = None, **extra: Any) -> None:
    """status.json: state is one of running, completed, failed, diverged, preempted."""
    write_json(run_dir / "status.json", {"state": state, "error": error, "final": final or {},
                                         "updated": utc_now(), **extra})
