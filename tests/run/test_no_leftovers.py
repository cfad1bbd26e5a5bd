"""Once `dtbench run` exits, no process of it is left: no rank, no warm server, no resource tracker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

SUITE = """name = "left"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 1
[budget]
max_steps = 3
[[run]]
method = "ddp"
world_size = 2
[[run]]
method = "gpipe"
world_size = 2
"""


def marked(mark: str) -> list[int]:
    """The pids of the processes whose environment carries `mark` (they inherited it from the command)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def test_no_process_of_a_run_outlives_dtbench_run(tmp_path):
    path = tmp_path / "left.toml"
    path.write_text(SUITE)
    mark = f"DTBENCH_TEST_MARK_{uuid.uuid4().hex}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", mark: "1"}
    result = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    deadline = time.monotonic() + 5  # a process may take a moment to be reaped after its parent's exit
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(mark) == []
