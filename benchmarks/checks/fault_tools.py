"""The fault sweep's means: suite files, `dtbench run` processes, waiting on run folders, and comparing runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DTBENCH = [sys.executable, "-m", "harness.cli"]

#: One method of each family, on 2 ranks of digits-mlp: data parallel, compressed, pipeline, local.
METHODS: dict[str, dict[str, Any]] = {
    "ddp": {},
    "qsgd": {"bits": 4},
    "gpipe": {"microbatches": 4},
    "local": {"variant": "chunked"},
}
#: Keys that differ between two attempts of one run by design: clocks, and where and when it ran.
TIME_KEYS = {"wall_time_s", "train_time_s", "busy_s", "wait_s", "span_s", "updated"}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def write_suite(path: Path, name: str, runs: list[dict[str, Any]], epochs: float = 2.0, batch_size: int = 8,
                **top: Any) -> Path:
    """A suite file: digits-mlp, seed 0, evaluation every half epoch, the `runs` ([[run]] tables) and `top` keys."""
    lines = [f"name = {_toml_value(name)}", 'workload = "digits-mlp"', "seeds = [0]", "threads_per_rank = 1"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    lines += ["", "[budget]", f"max_epochs = {epochs}", "eval_every_epochs = 0.5", "",
              "[defaults]", f"batch_size = {batch_size}", "lr = 0.05", "momentum = 0.9"]
    for run in runs:
        lines += ["", "[[run]]"] + [f"{k} = {_toml_value(v)}" for k, v in run.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_for(method: str, **extra: Any) -> dict[str, Any]:
    """The [[run]] table of `method` on 2 ranks."""
    table: dict[str, Any] = {"method": method, "world_size": 2}
    if METHODS[method]:
        table["params"] = METHODS[method]
    table.update(extra)
    return table


@dataclass
class Dtbench:
    """A `dtbench` command running in the background, in its own process group."""

    args: list[str]
    proc: subprocess.Popen = field(init=False)
    started: float = field(init=False)

    def __post_init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*DTBENCH, *self.args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def wait(self, timeout: float) -> tuple[int | None, str]:
        """(exit code, output); the code is None when it had to be killed after `timeout` seconds."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
            return self.proc.returncode, out
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, _ = self.proc.communicate()
            return None, out


def dtbench(*args: str, timeout: float = 300) -> tuple[int | None, str]:
    return Dtbench(list(args)).wait(timeout)


def read_status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def last_step(run_dir: Path) -> int:
    """The highest train step any rank has recorded (0 before the first)."""
    step = 0
    try:
        text = (run_dir / "metrics.jsonl").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if '"train"' in line:
            try:
                step = max(step, json.loads(line).get("step", 0))
            except ValueError:
                pass
    return step


def wait_until(predicate, timeout: float, every: float = 0.01) -> float | None:
    """Seconds until predicate() held, or None after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(every)
    return None


def wait_for_step(run_dir: Path, step: int, proc: Dtbench, timeout: float = 120) -> bool:
    """Whether the run reached `step` (and still runs) within `timeout`."""
    return wait_until(lambda: last_step(run_dir) >= step or proc.proc.poll() is not None, timeout) is not None \
        and proc.proc.poll() is None and last_step(run_dir) >= step


def rank_pids(run_dir: Path) -> dict[int, int]:
    return {int(r): pid for r, pid in (read_status(run_dir).get("pids") or {}).items()}


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def records(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """(the valid records of metrics.jsonl, how many non-blank lines were not valid JSON objects)."""
    good, bad = [], 0
    try:
        lines = (run_dir / "metrics.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        return [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(value, dict):
            good.append(value)
        else:
            bad += 1
    return good, bad


def learning(run_dir: Path) -> list[tuple]:
    """What a run learned, clocks left out: every train loss per (rank, step) and every evaluation."""
    out = []
    for r in records(run_dir)[0]:
        if r.get("kind") == "train":
            out.append(("train", r.get("rank"), r.get("step"), r.get("loss")))
        elif r.get("kind") == "eval":
            out.append(("eval", r.get("step"), r.get("test_accuracy"), r.get("test_loss")))
    return sorted(out, key=repr)


def same_learning(reference: Path, other: Path) -> str | None:
    """None when `other` learned bitwise what `reference` did, else where they first differ."""
    a, b = learning(reference), learning(other)
    if len(a) != len(b):
        return f"{len(b)} train/eval records, the uninterrupted run has {len(a)}"
    for x, y in zip(a, b, strict=True):
        if x != y:
            return f"{y} differs from the uninterrupted run's {x}"
    return None
