"""The run manifest: what code, software and machine produced a run, and the command that repeats it."""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.run.records import utc_now

PACKAGES = ("torch", "torchvision", "numpy", "pandas", "scikit-learn", "pydantic", "datasets", "submitit", "seaborn")


def git_state(source: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding dtbench's source, or nulls if it is not a git checkout."""
    source = source or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10, check=True).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("dtbench", *PACKAGES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def slurm_job_id() -> str | None:
    """This process's SLURM job id as the scheduler's commands take it: ARRAY_TASK for a job array's task."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def build(seed: int, launcher: str, run_dir: Path, threads_per_rank: int | list[int], argv: list[str] | None = None,
          network: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything that says where a run came from. Cheap: called once per run, before training.

    `network`: the emulated network the run used (rate, latency, namespaces, addresses), None for none.
    """
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "git": git_state(),
        "versions": versions(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu_model": gpu,
        "threads": {"per_rank": threads_per_rank, "torch_intraop": torch.get_num_threads(),
                    "torch_interop": torch.get_num_interop_threads()},
        "launcher": launcher,
        "network": network,
        "slurm_job_id": slurm_job_id(),
        "seed": seed,
        "start_time": utc_now(),
        "argv": list(argv) if argv is not None else [sys.executable, *sys.argv],
        "rerun": f"dtbench rerun {shlex.quote(str(run_dir.resolve()))}",
    }
