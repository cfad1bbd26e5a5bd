"""Checkpoints: RNG states as plain tensors, writing and loading one checkpoint file, metrics truncation, and stop
requests. Which files a run keeps, their sha256 sidecars and the choice on resume: harness/run/checkpoint_files.py."""

from __future__ import annotations

import io
import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    """This process's python, numpy and torch RNG states, as tensors and numbers only (weights_only loadable)."""
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() returned."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
    nps = state["numpy"]
    np.random.set_state((nps["name"], nps["keys"].numpy().astype(np.uint32), nps["pos"], nps["has_gauss"],
                         nps["cached_gaussian"]))
    torch.set_rng_state(state["torch"])


def write_file(path: Path, checkpoint: dict[str, Any]) -> None:
    """torch.save to `path` and fsync it (not atomic by itself: write a temp name, then rename)."""
    with open(path, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())


def save(path: Path, checkpoint: dict[str, Any]) -> None:
    """torch.save to a temp file next to `path`, fsync, then rename: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_file(tmp, checkpoint)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """A checkpoint written by save(), loaded with weights_only=True onto the CPU."""
    return _checked(torch.load(path, map_location="cpu", weights_only=True), path)


def loads(data: bytes, where: Path | str) -> dict[str, Any]:
    """load() of a checkpoint's bytes already in memory (`where`: its file, for messages)."""
    return _checked(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True), where)


def _checked(checkpoint: Any, where: Path | str) -> dict[str, Any]:
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT_VERSION:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{where}: checkpoint format {found!r}, this dtbench reads {FORMAT_VERSION}; remove the "
                         "file to start the run over")
    return checkpoint


def truncate_metrics(path: Path, size: int) -> None:
    """Cut metrics.jsonl back to `size` bytes: what was on disk when the checkpoint was taken. Records a killed
    attempt wrote after it (steps that will run again, a partial last line) go."""
    if path.exists() and path.stat().st_size > size:
        os.truncate(path, size)


class StopRequest:
    """Set by a signal handler (preemption, time limit), read by the training loop between steps.

    `requeue`: the signal asks the job to be requeued by us (submitit's USR2 convention); otherwise the scheduler
    requeues or ends the job itself (SIGTERM).
    """

    def __init__(self) -> None:
        self.signum = 0  # the signal that asked for the stop, 0 while none has
        self.requeue = False

    @property
    def requested(self) -> bool:
        return self.signum != 0

    def handler(self, requeue: bool):
        def handle(signum: int, _frame: Any) -> None:
            self.signum = signum
            self.requeue = self.requeue or requeue

        return handle

    def install(self, requeue_on: tuple[int, ...] = (), stop_on: tuple[int, ...] = ()) -> None:
        """Handle these signals from now on (main thread only)."""
        for signum in stop_on:
            signal.signal(signum, self.handler(False))
        for signum in requeue_on:
            signal.signal(signum, self.handler(True))


#: The process's stop request: the loop checks it; launchers install its signal handlers.
STOP = StopRequest()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
