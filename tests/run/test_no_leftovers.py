"""Once `dtbench run` exits, no process of it is left: no rank, no warm server, no resource tracker; also when it
is interrupted."""

from __future__ import annotations

import os
import signal
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
    with (tmp_path / "output.txt").open("w") as output:  # a file, not a pipe: waiting for a pipe's end would wait
        # for every process holding it, so a leftover that holds it would be waited for, not found
        code = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path)],
                              env=_env(mark), stdout=output, stderr=subprocess.STDOUT, timeout=300).returncode
        left = [describe(pid) for pid in marked(mark)]  # at once: nothing may linger, however briefly
    assert code == 0, (tmp_path / "output.txt").read_text()
    # The command kills and reaps its warm server and its resource tracker before it exits (harness.launch.warm
    # .stop); a server left to its own exit lingered 0.4 to 3.6 s, holding the command's output open.
    assert left == []


def test_an_interrupted_run_leaves_no_process(tmp_path):
    path = tmp_path / "long.toml"
    path.write_text(SUITE.replace("max_steps = 3", "max_steps = 100000"))
    mark = f"DTBENCH_TEST_MARK_{uuid.uuid4().hex}"
    with (tmp_path / "output.txt").open("w") as output:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path),
                                 "--quiet"], env=_env(mark), stdout=output, stderr=subprocess.STDOUT)
        metrics = tmp_path / "left" / "ddp-digits-mlp-w2-s0" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while '"train"' not in (metrics.read_text() if metrics.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        left = [describe(pid) for pid in marked(mark)]
    assert code == 130 and "interrupted" in (tmp_path / "output.txt").read_text()
    assert left == []


def _env(mark: str) -> dict[str, str]:
    """The command's environment, with `mark` for marked() to find its processes by."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", mark: "1"}


def describe(pid: int) -> str:
    """A leftover process, for the failure message: pid, state and command line."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().split()[2]
        command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} {state} {command[:200]}"
