"""Writing a run's files: metrics.jsonl records, and atomic spec/status/manifest JSON."""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.run.clock import TrainClock


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
    try:
        tmp.write_text(json.dumps(_clean(obj), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:  # e.g. a full disk: no half-written temp file is left behind
        tmp.unlink(missing_ok=True)
        raise


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_status(run_dir: Path, state: str, error: dict[str, Any] | None = None,
                 final: dict[str, Any] | None = None, **extra: Any) -> None:
    """status.json: state is one of running, completed, failed, diverged, preempted, does_not_fit (a plan over
    memory_per_rank, refused before the first step)."""
    write_json(run_dir / "status.json", {"state": state, "error": error, "final": final or {},
                                         "updated": utc_now(), **extra})
