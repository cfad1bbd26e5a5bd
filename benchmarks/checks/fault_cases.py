"""The fault sweep's cases: each injects one fault into real `dtbench run` processes at a random point and says
what happened, whether any data was lost, and how long detection took."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fault_tools import (
    Dtbench,
    alive,
    dtbench,
    last_step,
    rank_pids,
    read_status,
    records,
    run_for,
    same_learning,
    wait_for_step,
    wait_until,
    write_suite,
)

HANG_TIMEOUT_S = 5.0
STEPS = 2 * 180  # digits-mlp at batch 8: 1437 training samples, 180 steps an epoch; the suites run 2 epochs


@dataclass
class Outcome:
    outcome: str  # what the system did
    lost: str  # "none", or which data was lost
    detect_s: float | None = None  # fault to the run's status saying so

    @property
    def ok(self) -> bool:
        return self.lost == "none"


@dataclass
class Sweep:
    """What the cases share: a scratch folder, the random source, and the uninterrupted reference runs."""

    work: Path
    rng: random.Random
    references: dict[str, Path]

    def folder(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work))
        return path

    def reference(self, method: str) -> Path:
        """The run folder of `method` trained without a fault (made once), to compare resumed runs with."""
        if method not in self.references:
            out = self.folder(f"reference-{method}")
            suite = write_suite(out / "s.toml", "ref", [run_for(method, label="target")], checkpoint_every_steps=10)
            code, text = dtbench("run", str(suite), "--out", str(out), "--quiet")
            if code != 0:
                raise RuntimeError(f"the reference run of {method} failed:\n{text}")
            self.references[method] = _run_dir(out / "ref")
        return self.references[method]


def _run_dir(suite_dir: Path, label: str = "target") -> Path:
    found = sorted(suite_dir.glob(f"{label}-*"))
    return found[0] if found else suite_dir / f"{label}-missing"


def _started_run_dir(suite_dir: Path, proc: Dtbench, timeout: float = 120) -> Path:
    """The target run's folder once `dtbench run` has made it (or the missing name when the process ended first)."""
    wait_until(lambda: _run_dir(suite_dir).exists() or proc.proc.poll() is not None, timeout)
    return _run_dir(suite_dir)


def _random_step(rng: random.Random) -> int:
    return rng.randint(10, int(STEPS * 0.6))


def _after_fault(out: Path, proc: Dtbench, fault_at: float, victims: list[int], hit: int | None = None) -> Outcome:
    """The run was hit: wait for the suite to end; check the failure was named (rank `hit`, when one rank was),
    nothing survived, the next run ran."""
    run_dir = _run_dir(out / "s")
    seen = wait_until(lambda: read_status(run_dir).get("state") not in (None, "running"), 120)
    detect = None if seen is None else time.monotonic() - fault_at
    code, text = proc.wait(180)
    status = read_status(run_dir)
    error = (status.get("error") or {}).get("message", "")
    lost = []
    if code is None:
        lost.append("dtbench run hung (killed after 180 s)")
    if any(alive(pid) for pid in victims):
        lost.append("a rank process outlived the run")
    _, bad = records(run_dir)
    if bad > 1:
        lost.append(f"{bad} corrupt lines in metrics.jsonl")
    named = (status.get("error") or {}).get("rank")
    if hit is not None and named != hit:
        lost.append(f"named rank {named}, but rank {hit} was hit")
    after = read_status(_run_dir(out / "s", "after")).get("state")
    if after != "completed":
        lost.append(f"the next run of the suite ended {after!r}")
    return Outcome(f"{status.get('state')}: {error}" if error else str(status.get("state")),
                   "; ".join(lost) or "none", detect)


def rank_signal(sweep: Sweep, method: str, signum: int) -> Outcome:
    """kill -9 or SIGSTOP of one rank at a random step; a second run follows in the same suite."""
    out = sweep.folder(f"{signal.Signals(signum).name}-{method}")
    suite = write_suite(out / "s.toml", "s", [run_for(method, label="target"),
                                              {"method": "sgd", "world_size": 1, "label": "after"}],
                        hang_timeout_s=HANG_TIMEOUT_S)
    proc = Dtbench(["run", str(suite), "--out", str(out), "--quiet"])
    run_dir = _started_run_dir(out / "s", proc)
    if not wait_for_step(run_dir, _random_step(sweep.rng), proc):
        return Outcome("the run ended before the fault: " + proc.wait(60)[1][-200:], "not tried")
    pids = rank_pids(run_dir)
    victim = sweep.rng.choice(sorted(pids))
    os.kill(pids[victim], signum)
    fault_at = time.monotonic()
    return _after_fault(out, proc, fault_at, list(pids.values()), hit=victim)


def _checkpointed_run(sweep: Sweep, name: str, method: str, every: int, step: int
                      ) -> tuple[Path, Path, Dtbench, Path] | None:
    """`dtbench run` of `method` checkpointing every `every` steps, started in a fresh folder and watched until it
    reaches `step`: (out, suite file, process, run folder), or None when it ended first."""
    out = sweep.folder(name)
    suite = write_suite(out / "s.toml", "s", [run_for(method, label="target")], checkpoint_every_steps=every)
    proc = Dtbench(["run", str(suite), "--out", str(out), "--quiet"])
    run_dir = _started_run_dir(out / "s", proc)
    return (out, suite, proc, run_dir) if wait_for_step(run_dir, step, proc) else None


def stop_and_resume(sweep: Sweep, method: str, signum: int) -> Outcome:
    """SIGUSR2 (stop after a checkpoint) or SIGTERM (dies; periodic checkpoints every 10 steps) to one rank at a
    random step, then `dtbench run --resume`: it must learn bitwise what the uninterrupted run did."""
    reference = sweep.reference(method)
    started = _checkpointed_run(sweep, f"{signal.Signals(signum).name}-{method}", method, 10, _random_step(sweep.rng))
    if started is None:
        return Outcome("the run ended before the fault", "not tried")
    out, suite, proc, run_dir = started
    pids = rank_pids(run_dir)
    os.kill(pids[sweep.rng.choice(sorted(pids))], signum)
    fault_at = time.monotonic()
    seen = wait_until(lambda: read_status(run_dir).get("state") not in (None, "running"), 120)
    detect = None if seen is None else time.monotonic() - fault_at
    proc.wait(120)
    stopped = read_status(run_dir)
    steps = (stopped.get("final") or {}).get("steps") or last_step(run_dir)
    return _resume(out, suite, run_dir, reference, f"{stopped.get('state')} at step {steps}", detect)


def _resume(out: Path, suite: Path, run_dir: Path, reference: Path, before: str, detect: float | None) -> Outcome:
    code, text = dtbench("run", str(suite), "--out", str(out), "--quiet", "--resume", timeout=180)
    status = read_status(run_dir)
    # the run's last line names the checkpoint rank 0 loaded: "[1/1] RUN: completed in 3.1 s (resuming from ...)"
    said = [m.group(1) for m in re.finditer(r" in [0-9.]+ s \((.*)\)$", text, re.MULTILINE)]
    outcome = f"{_short(before)}; resumed: {status.get('state')}" + (f" ({said[0][:150]})" if said else "")
    if code != 0 or status.get("state") != "completed":
        return Outcome(outcome, f"the resumed run ended {status.get('state')!r} (exit {code})", detect)
    difference = same_learning(reference, run_dir)
    return Outcome(outcome, "none" if difference is None else f"not bitwise: {difference}", detect)


def _short(text: str) -> str:
    return text if len(text) < 80 else text[:77] + "..."


def kill_in_checkpoint(sweep: Sweep, method: str) -> Outcome:
    """kill -9 of rank 0 (the writer) at a random moment of a run that checkpoints every step, then --resume."""
    reference = sweep.reference(method)
    started = _checkpointed_run(sweep, f"kill-in-checkpoint-{method}", method, 1, _random_step(sweep.rng) // 3)
    if started is None:
        return Outcome("the run ended before the fault", "not tried")
    out, suite, proc, run_dir = started
    time.sleep(sweep.rng.uniform(0, 0.02))
    os.kill(rank_pids(run_dir)[0], signal.SIGKILL)
    cut = any(run_dir.glob(".*.tmp*"))  # the temp file of a write the kill cut short
    proc.wait(120)
    return _resume(out, suite, run_dir, reference, f"killed {'in' if cut else 'between'} checkpoint writes", None)


def damaged_checkpoint(sweep: Sweep, method: str, how: str) -> Outcome:
    """A run stopped by SIGUSR2, its checkpoint.pt then corrupted (64 zero bytes mid-file) or truncated (half),
    then --resume: it must not resume from the damage, and must still learn what the uninterrupted run did."""
    reference = sweep.reference(method)
    started = _checkpointed_run(sweep, f"{how}-checkpoint-{method}", method, 10, _random_step(sweep.rng))
    if started is None:
        return Outcome("the run ended before the fault", "not tried")
    out, suite, proc, run_dir = started
    os.kill(rank_pids(run_dir)[1], signal.SIGUSR2)
    proc.wait(120)
    path = run_dir / "checkpoint.pt"
    if not path.exists():
        return Outcome(f"no checkpoint.pt after the stop ({read_status(run_dir).get('state')})", "not tried")
    data = bytearray(path.read_bytes())
    if how == "corrupt":
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(64)
    else:
        del data[len(data) // 2:]
    path.write_bytes(bytes(data))
    return _resume(out, suite, run_dir, reference, f"checkpoint {how}ed", None)


def damaged_metrics(sweep: Sweep, method: str, how: str) -> Outcome:
    """A finished run's metrics.jsonl with one line cut in half or one garbage line inserted, then `dtbench report`:
    the report keeps every other line and says how many it dropped."""
    reference = sweep.reference(method)
    out = sweep.folder(f"{how}-metrics-{method}")
    run_dir = out / "s" / reference.name
    shutil.copytree(reference, run_dir)
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    at = sweep.rng.randrange(len(lines))
    if how == "truncated":
        lines[at] = lines[at][: len(lines[at]) // 2] + "\n"
    else:
        lines.insert(at, "".join(chr(sweep.rng.randrange(32, 0x2FF)) for _ in range(40)) + "\n")
    path.write_text("".join(lines))
    before = len(records(reference)[0])
    code, text = dtbench("report", str(out / "s"), timeout=180)
    said = [re.sub(r"\S*/(metrics\.jsonl)", r"\1", line.strip()) for line in text.splitlines()
            if "dropped" in line or "skipped" in line]
    kept = len(records(run_dir)[0])
    summary = out / "s" / "report" / "summary.csv"
    listed = summary.exists() and reference.name in summary.read_text()
    lost = before - kept - (1 if how == "truncated" else 0)
    outcome = f"report exit {code}; " + (said[0][:140] if said else "no word of the dropped line")
    problems = []
    if code != 0 or not listed:
        problems.append("the run is missing from the report")
    if lost:
        problems.append(f"{lost} more records lost than the damaged line")
    if not said:
        problems.append("the report did not say it dropped a line")
    return Outcome(outcome, "; ".join(problems) or "none")


def full_disk(sweep: Sweep, method: str) -> Outcome:
    """`--out` on a 256 KiB tmpfs: the run must fail with a clear message, and nothing be taken as complete."""
    if os.geteuid() != 0:
        return Outcome("skipped: mounting a tmpfs needs root", "not tried")
    mount = sweep.folder(f"full-disk-{method}")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        suite = write_suite(sweep.folder("full-disk-suite") / "s.toml", "s",
                            [run_for(method, label="target"), {"method": "sgd", "world_size": 1, "label": "after"}],
                            checkpoint_every_steps=20)
        started = time.monotonic()
        code, text = dtbench("run", str(suite), "--out", str(mount), "--quiet", timeout=180)
        took = time.monotonic() - started
        lost = []
        for run_dir in sorted((mount / "s").glob("*-*")):
            status = read_status(run_dir)
            if status.get("state") == "completed" and not any(r.get("kind") == "eval" for r in records(run_dir)[0]):
                lost.append(f"{run_dir.name} says completed without its records")
        if "Traceback" in text:
            lost.append("a traceback instead of a message")
        said = [x for x in text.splitlines() if "No space" in x] or [x for x in text.splitlines() if "cannot" in x]
        line = said[0] if said else text[-150:]
        return Outcome(f"exit {code}: {line.strip()[:160]}", "; ".join(lost) or "none", took)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def link_down(sweep: Sweep, method: str) -> Outcome:
    """An emulated network (docs/network.md) whose rank-1 link goes down mid-run: the run fails within the hang
    timeout."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return Outcome("skipped: network emulation needs root and iproute2", "not tried")
    out = sweep.folder(f"link-down-{method}")
    suite = write_suite(out / "s.toml", "s", [run_for(method, label="target", network="1gbit"),
                                              {"method": "sgd", "world_size": 1, "label": "after"}],
                        hang_timeout_s=HANG_TIMEOUT_S)
    proc = Dtbench(["run", str(suite), "--out", str(out), "--quiet"])
    run_dir = _started_run_dir(out / "s", proc)
    if not wait_for_step(run_dir, _random_step(sweep.rng), proc):
        return Outcome("the run ended before the fault: " + proc.wait(60)[1][-300:], "not tried")
    import json

    namespaces = json.loads((run_dir / "manifest.json").read_text())["network"]["namespaces"]
    subprocess.run(["ip", "-n", namespaces[1], "link", "set", "dtbnet", "down"], check=True)
    return _after_fault(out, proc, time.monotonic(), list(rank_pids(run_dir).values()))


def shared_folder(sweep: Sweep, method: str) -> Outcome:
    """Two `dtbench run` of one suite into one results folder at once: one must refuse, the other must finish with
    every (rank, step) recorded once."""
    out = sweep.folder(f"shared-{method}")
    # 40 epochs (about 15 s of training): the second `dtbench run` needs a second or two to start, and must find the
    # first still writing
    suite = write_suite(out / "s.toml", "s", [run_for(method, label="target")], epochs=40.0)
    first = Dtbench(["run", str(suite), "--out", str(out), "--quiet"])
    # the second starts while the first is running (its run has begun training), at a random moment after that
    if not wait_for_step(_started_run_dir(out / "s", first), 1, first):
        return Outcome("the first run ended before the second could start: " + first.wait(60)[1][-200:], "not tried")
    time.sleep(sweep.rng.uniform(0.0, 1.0))
    second = Dtbench(["run", str(suite), "--out", str(out), "--quiet"])
    results = [first.wait(180), second.wait(180)]
    codes = [c for c, _ in results]
    refusal = next((t.strip().splitlines()[-1] for c, t in results if c not in (0, None)), "neither refused")
    refusal = re.sub(r"\S+/s: another", "<out>/s: another", refusal)
    run_dir = _run_dir(out / "s")
    train = [(r.get("rank"), r.get("step")) for r in records(run_dir)[0] if r.get("kind") == "train"]
    lost = []
    if sorted(codes) != [0, 2] and sorted(codes) != [0, 1]:
        lost.append(f"exit codes {codes}")
    if len(train) != len(set(train)):
        lost.append("steps recorded twice (interleaved writers)")
    if read_status(run_dir).get("state") != "completed":
        lost.append(f"the run ended {read_status(run_dir).get('state')!r}")
    return Outcome(f"exit codes {codes}: {refusal[:140]}", "; ".join(lost) or "none")
