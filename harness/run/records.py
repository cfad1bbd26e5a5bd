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
#: The train record's own keys: `extra` fields named so go through write(), which lets them replace these.
TRAIN_KEYS = frozenset({"kind", "rank", "wall_time_s", "train_time_s", "step", "epoch", "samples", "loss", "lr",
                        "bytes_sent", "bytes_recv", "bytes_by_category"})


def _plain_float(value: Any) -> bool:
    """A finite float of the float type itself (the encoder writes those as their repr; a subclass such as numpy's
    float64 has a repr of its own)."""
    return type(value) is float and math.isfinite(value)


def _plain_key(key: Any) -> bool:
    """A key the encoder writes as it is between quotes (nothing to escape)."""
    return type(key) is str and key.isascii() and key.isidentifier()


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

    def write_train(self, step: int, epoch: float, samples: int, loss: float | None, lr: float, bytes_sent: int,
                    bytes_recv: int, bytes_by_category: dict[str, list[int]], extra: dict[str, Any]) -> None:
        """The `train` record, written at every step: the very line that write("train", step=..., ..., **extra)
        writes, formatted here directly (the hot path: a step's runner cost, docs/benchmarks.md) where every value
        is a plain int or finite float, None for the loss, and the categories' names need no escaping; through
        write() otherwise."""
        wall, train = round(self.clock.wall(), 6), round(self.clock.train(), 6)
        plain = (type(self.rank) is int and type(step) is int and type(samples) is int and type(bytes_sent) is int
                 and type(bytes_recv) is int and _plain_float(epoch) and _plain_float(lr)
                 and (loss is None or _plain_float(loss)) and _plain_float(wall) and _plain_float(train)
                 and all(_plain_key(k) and type(v) is list and all(type(n) is int for n in v)
                         for k, v in bytes_by_category.items()))
        tail = "}"
        if plain and extra:
            plain = TRAIN_KEYS.isdisjoint(extra) and all(type(k) is str for k in extra)
            if plain:
                try:
                    tail = ", " + _ENCODER.encode(extra)[1:]
                except (TypeError, ValueError):  # a NaN, or a value the encoder does not know: write() decides
                    plain = False
        if not plain:
            self.write("train", step=step, epoch=epoch, samples=samples, loss=loss, lr=lr, bytes_sent=bytes_sent,
                       bytes_recv=bytes_recv, bytes_by_category=bytes_by_category, **extra)
            return
        categories = ", ".join(f'"{k}": [{", ".join(map(repr, v))}]' for k, v in bytes_by_category.items())
        line = (f'{{"kind": "train", "rank": {self.rank!r}, "wall_time_s": {wall!r}, "train_time_s": {train!r}, '
                f'"step": {step!r}, "epoch": {epoch!r}, "samples": {samples!r}, '
                f'"loss": {"null" if loss is None else repr(loss)}, "lr": {lr!r}, "bytes_sent": {bytes_sent!r}, '
                f'"bytes_recv": {bytes_recv!r}, "bytes_by_category": {{{categories}}}{tail}\n')
        os.write(self._fd, line.encode())

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
