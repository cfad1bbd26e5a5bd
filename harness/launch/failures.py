"""Why a run failed: the failing rank's own error line, else its signal or exit code, and which rank failed first."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from harness.run.worker import ERROR_FILE


def describe_failure(rank: int, exitcode: int, run_dir: Path) -> dict:
    """Why rank `rank` ended: its own error line if it wrote one, else its signal or exit code."""
    error_file = run_dir / ERROR_FILE.format(rank=rank)
    if error_file.exists():
        try:
            message = json.loads(error_file.read_text())["message"]
            return {"message": f"rank {rank}: {message}", "rank": rank}
        except (OSError, ValueError, KeyError):
            pass
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return {"message": f"rank {rank} was killed by signal {name}", "rank": rank}
    return {"message": f"rank {rank} exited with code {exitcode} (see logs/rank{rank}.log)", "rank": rank}


def error_time(run_dir: Path, rank: int) -> float:
    """When a rank wrote its error file (a killed rank writes none: it counts as first)."""
    try:
        return os.stat(run_dir / ERROR_FILE.format(rank=rank)).st_mtime
    except OSError:
        return float("-inf")
