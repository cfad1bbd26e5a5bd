"""Progress of a running run, for people: metrics.jsonl followed as it grows, and a tqdm bar per run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm


class MetricsTail:
    """Follows metrics.jsonl as it grows, for progress: the latest rank-0 epoch and eval accuracy."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.epoch = 0.0
        self.accuracy: float | None = None

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in chunk[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("rank") == 0 and isinstance(record.get("epoch"), (int, float)):
                self.epoch = max(self.epoch, float(record["epoch"]))
            if record.get("kind") == "eval" and isinstance(record.get("test_accuracy"), (int, float)):
                self.accuracy = float(record["test_accuracy"])


class RunBar:
    """A tqdm bar of one run (epochs done, last accuracy), shown on an interactive terminal only; fed by a
    MetricsTail through `update`, closed by `close`."""

    def __init__(self, total_epochs: float | None, desc: str, show: bool):
        self.total = total_epochs
        self.bar = tqdm(total=total_epochs, desc=desc, unit="epoch", leave=False, file=sys.stderr, mininterval=0.5,
                        disable=None if show else True,  # None: only when stderr is a terminal
                        bar_format="{desc}: {n:.2f}/{total} epochs |{bar}| {elapsed} {postfix}"
                        if total_epochs else None)
        self.epoch = 0.0
        self.accuracy: float | None = None

    def update(self, tail: MetricsTail) -> None:
        epoch = min(tail.epoch, self.total) if self.total else tail.epoch
        if epoch > self.epoch:
            self.bar.update(epoch - self.epoch)
            self.epoch = epoch
        if tail.accuracy is not None and tail.accuracy != self.accuracy:
            self.accuracy = tail.accuracy
            self.bar.set_postfix_str(f"acc {tail.accuracy:.3f}")

    def close(self) -> None:
        self.bar.close()
