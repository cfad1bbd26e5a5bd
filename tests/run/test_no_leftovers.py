"""Once `dtbench run` exits, no process of it is left: no rank, no warm server, no resource tracker; also when it
is interrupted, and when it is killed with SIGKILL (its ranks follow it, and hold the suite folder's lock until they
have ended). While it runs, it and its ranks listen on loopback only."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from _signals import with_default_sigint

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


@pytest.mark.slow
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


#: A run that cannot end by itself before the test stops it: its step and epoch budgets far beyond any test's time
#: (digits-mlp's own budget, 10 epochs, ended it in seconds on a quiet machine: the interrupt then came too late).
LONG = SUITE.replace("max_steps = 3", "max_steps = 10000000\nmax_epochs = 1000000")


@pytest.mark.slow
def test_an_interrupted_run_leaves_no_process(tmp_path):
    path = tmp_path / "long.toml"
    path.write_text(LONG)
    mark = f"DTBENCH_TEST_MARK_{uuid.uuid4().hex}"
    with (tmp_path / "output.txt").open("w") as output:
        command = [sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path), "--quiet"]
        proc = subprocess.Popen(with_default_sigint(command), env=_env(mark), stdout=output, stderr=subprocess.STDOUT)
        metrics = tmp_path / "left" / "ddp-digits-mlp-w2-s0" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while '"train"' not in (metrics.read_text() if metrics.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        finally:  # a run that ignored the interrupt trains on forever: end it (its ranks are tethered to it)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        left = [describe(pid) for pid in marked(mark)]
    assert code == 130 and "interrupted" in (tmp_path / "output.txt").read_text()
    assert left == []


@pytest.mark.slow
def test_a_killed_launcher_takes_every_process_with_it_and_listens_on_loopback_only(tmp_path):
    """kill -9 of `dtbench run` in the middle of a run: its ranks, warm server and resource tracker end with it (they
    trained on under init before, and wrote into the next run's folder); the suite folder's lock stays held while a
    rank lives, so no new run can start into the folder meanwhile. Before the kill, the sockets the run listens on
    are all on loopback (the store listened on every interface before)."""
    from harness.launch.lock import FolderBusy, suite_lock

    path = tmp_path / "long.toml"
    path.write_text(LONG)
    mark = f"DTBENCH_TEST_MARK_{uuid.uuid4().hex}"
    run_dir = tmp_path / "left" / "ddp-digits-mlp-w2-s0"
    with (tmp_path / "output.txt").open("w") as output:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path),
                                 "--quiet"], env=_env(mark), stdout=output, stderr=subprocess.STDOUT)
        try:
            _wait_for_training(run_dir / "metrics.jsonl", proc)
            listening = {(pid, address) for pid in marked(mark) for address in listening_addresses(pid)}
            ranks = [int(pid) for pid in json.loads((run_dir / "status.json").read_text())["pids"].values()]
        finally:
            proc.kill()
            proc.wait()
    # the launcher's store, and each rank's gloo listener (and a rank's own store client listens on nothing)
    assert {pid for pid, _ in listening} >= {proc.pid, *ranks}, listening
    assert all(address == "127.0.0.1" for _, address in listening), listening
    # The lock is free only once no rank is left, and then everything is gone within moments.
    deadline = time.monotonic() + 120  # a cap for a loaded machine; the processes go in well under a second here
    while True:
        try:
            with suite_lock(tmp_path / "left"):
                alive_at_release = [describe(pid) for pid in ranks if _alive(pid)]
                break
        except FolderBusy:
            assert time.monotonic() < deadline, [describe(pid) for pid in marked(mark)]
            time.sleep(0.05)
    assert alive_at_release == []
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [describe(pid) for pid in marked(mark)] == []
    # A new run into the folder: accepted, and nothing of the killed one writes into it.
    path.write_text(SUITE)
    code = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path), "--quiet",
                           "--resume"], env=_env(mark), capture_output=True, text=True, timeout=300)
    assert code.returncode == 0, code.stdout + code.stderr
    assert not list(run_dir.glob("error-rank*.json"))
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


def _wait_for_training(metrics: Path, proc: subprocess.Popen, cap_s: float = 180) -> None:
    """Until the run has logged a train record (its ranks are up and talking); fails if the command ended first."""
    deadline = time.monotonic() + cap_s
    while '"train"' not in (metrics.read_text() if metrics.exists() else ""):
        assert proc.poll() is None, "the run ended before it trained"
        assert time.monotonic() < deadline, "no train record within the cap"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Whether pid is a live process (not gone, not a zombie)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of the TCP sockets (IPv4 and IPv6) that process `pid` listens on, read from /proc."""
    try:
        inodes = {os.readlink(fd)[len("socket:["):-1] for fd in (Path("/proc") / str(pid) / "fd").iterdir()
                  if os.readlink(fd).startswith("socket:[")}
    except OSError:
        return []
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (Path("/proc") / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_address(fields[1].split(":")[0]))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp's hex address (little-endian words) as text: 0100007F -> 127.0.0.1."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


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
