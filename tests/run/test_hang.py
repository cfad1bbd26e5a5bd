"""Hang detection: a stopped rank fails its run within the hang timeout (naming it, not its blocked peers) and the
suite goes on; a long evaluation or a slow start is not a hang; hang_timeout_s is validated; the in-rank watch that
SLURM runs names a stopped rank over a real TCPStore."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch.hang import StallJudge
from harness.results import read_jsonl
from harness.suite.expand import expand_suite
from harness.suite.files import FileError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def suite(tmp_path: Path, name: str, body: str, budget: str, hang: float | None = 5) -> Path:
    path = tmp_path / f"{name}.toml"
    key = f"hang_timeout_s = {hang}\n" if hang is not None else ""
    path.write_text(f'name = "{name}"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n{key}'
                    f"[budget]\n{budget}\n{body}")
    return path


def _status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _release(pids: list[int]) -> None:
    """Whatever is left of these processes, stopped or not, is killed."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


# -- the judge alone -----------------------------------------------------------------------------------------------
def test_judge_names_the_silent_rank_not_its_blocked_peer():
    judge = StallJudge(2, timeout_s=5, now=0.0)
    for t in range(0, 10):  # both train: progress and beats move
        judge.observe(0, t, t, float(t))
        judge.observe(1, t, t, float(t))
    assert judge.verdict(9.0) is None
    # rank 1 stops at t=9.0; rank 0 still makes its last step at 9.5, then waits for rank 1, beating
    judge.observe(0, 10, 10, 9.5)
    for t in range(11, 16):
        judge.observe(0, 10, t, float(t))
    assert judge.verdict(13.9) is None
    assert judge.verdict(14.0) == 1
    # a rank that has ended is no longer watched or named: rank 0 alone, stalled since 9.5
    judge.ended(1)
    assert judge.verdict(14.4) is None and judge.verdict(14.5) == 0


# -- suite key -----------------------------------------------------------------------------------------------------
def test_hang_timeout_s_resolves_into_the_spec(tmp_path):
    body = '[[run]]\nmethod = "sgd"\n[[run]]\nmethod = "ddp"\nworld_size = 2\nhang_timeout_s = 7.5\n'
    default = expand_suite(suite(tmp_path, "d", body.replace("hang_timeout_s = 7.5\n", ""), "max_steps = 2", None))
    assert [s.hang_timeout_s for s in default] == [60.0, 60.0]
    specs = expand_suite(suite(tmp_path, "h", body, "max_steps = 2", 5))
    assert [s.hang_timeout_s for s in specs] == [5.0, 7.5]
    assert json.loads(specs[1].model_dump_json())["hang_timeout_s"] == 7.5  # what spec.json holds


@pytest.mark.parametrize("top,run,field", [
    ("0", None, "hang_timeout_s"), ("-1", None, "hang_timeout_s"), ('"5"', None, "hang_timeout_s"),
    ("true", None, "hang_timeout_s"), ("inf", None, "hang_timeout_s"), (None, "0", "run[0].hang_timeout_s"),
    (None, "-0.5", "run[0].hang_timeout_s"),
])
def test_bad_hang_timeout_values_name_the_file_and_field(tmp_path, top, run, field):
    body = '[[run]]\nmethod = "sgd"\n' + (f"hang_timeout_s = {run}\n" if run else "")
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\nworkload = "digits-mlp"\n' + (f"hang_timeout_s = {top}\n" if top else "")
                    + f"[budget]\nmax_steps = 2\n{body}")
    with pytest.raises(FileError, match=f"^{re.escape(f'{path}: {field}: ')}"):
        expand_suite(path)


def test_bad_hang_timeout_exits_2(tmp_path, capsys):
    path = suite(tmp_path, "bad", '[[run]]\nmethod = "sgd"\n', "max_steps = 2", 0)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: hang_timeout_s: " in err and "greater than 0" in err
    assert not (tmp_path / "out").exists()


# -- a stopped rank, end to end ------------------------------------------------------------------------------------
HANG = 5.0


@pytest.mark.slow
def test_stopped_rank_fails_the_run_within_the_timeout_and_the_suite_goes_on(tmp_path):
    body = '[[run]]\nmethod = "ddp"\nworld_size = 2\n[[run]]\nmethod = "sgd"\nbudget = { max_epochs = 1 }\n'
    path = suite(tmp_path, "hang", body, "max_epochs = 2000\neval_every_epochs = 1000", HANG)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(out), "--quiet"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = out / "hang" / "ddp-digits-mlp-w2-s0"
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sum(r["kind"] == "train" and r["rank"] == 1 for r in read_jsonl(run_dir / "metrics.jsonl")) > 20:
                break  # mid-run: well past the first step, which counts as set-up
            time.sleep(0.2)
        else:
            pytest.fail("the ddp run never started training")
        pids = [int(pid) for pid in _status(run_dir)["pids"].values()]
        os.kill(pids[1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        status = {}
        while time.monotonic() - stopped_at < HANG + 25:  # bounded: without a watch it would wait 120 s
            status = _status(run_dir)
            if status.get("state") != "running":
                break
            time.sleep(0.1)
        took = time.monotonic() - stopped_at
        assert status.get("state") == "failed", f"still {status.get('state')} {took:.0f} s after SIGSTOP"
        assert HANG - 1 <= took <= HANG + 8, took
        assert status["error"] == {"message": "rank 1 made no progress for 5 s (stopped?)", "rank": 1}
        for pid in pids:  # every rank is gone, the stopped one included (failed is written after the teardown)
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 1, stderr + stdout
        assert _status(out / "hang" / "sgd-digits-mlp-w1-s0")["state"] == "completed"
        assert "rank 1 made no progress for 5 s (stopped?)" in stdout + stderr
    finally:
        _release(pids)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# -- long evaluations and slow starts are progress -----------------------------------------------------------------
SLOW_PAUSE_S, SLOW_HANG_S = 4.5, 3
SLOW = '''
import time

from methods.reference.ddp import DDP

PAUSE_S = {pause}


class SlowDDP(DDP):
    """ddp with a slow set-up and first step on rank 1, and slow evaluations on rank 0, each longer than the
    hang timeout: the peers wait for it in a barrier or a collective meanwhile."""

    name = "slow-ddp"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.steps = 0
        if ctx.rank == 1:
            time.sleep(PAUSE_S)

    def train_step(self, batch):
        if self.steps == 0 and self.ctx.rank == 1:
            time.sleep(PAUSE_S)
        self.steps += 1
        return super().train_step(batch)

    def evaluate(self, test):
        if self.ctx.rank == 0:
            time.sleep(PAUSE_S)
        return super().evaluate(test)
'''


@pytest.mark.slow
def test_long_evaluation_and_slow_start_are_not_hangs(tmp_path):
    """Every pause (4.5 s) is longer than the hang timeout (3 s), with no step ending meanwhile on any rank: a watch
    that counted only steps would tear this run down at its set-up, its first step or its first evaluation. (The
    heartbeat thread beats every 0.3 s meanwhile: a false verdict would need it starved for 3 s, ten times what the
    machine's load has ever delayed a thread here.)"""
    (tmp_path / "slowmethod.py").write_text(SLOW.format(pause=SLOW_PAUSE_S))
    body = '[[run]]\nmethod = "slowmethod:SlowDDP"\nworld_size = 2\n'
    path = suite(tmp_path, "slow", body, "max_steps = 6\neval_every_epochs = 1000", SLOW_HANG_S)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), ENV.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path / "out"),
                           "--quiet"], env=env, capture_output=True, text=True, timeout=240)
    run_dir = next((tmp_path / "out" / "slow").glob("*/spec.json")).parent
    status = _status(run_dir)
    assert proc.returncode == 0 and status["state"] == "completed", (status, proc.stderr + proc.stdout)
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 6]  # two slow evaluations happened
    assert status["final"]["wall_time_s"] >= 3 * SLOW_PAUSE_S  # and the slow first step (the set-up is before it)


# -- the in-rank watch SLURM runs ------------------------------------------------------------------------------------
def _store_rank(rank: int, world_size: int, port, steps, out: str, timeout_s: float) -> None:
    """A fake rank: hosts the store on rank 0 as under SLURM, beats through a StoreWatch, and takes steps in lockstep
    with its peers (each waits for the slowest, as in a collective), until the watch fires."""
    import torch.distributed as dist

    from harness.launch.slurm_watch import StoreWatch
    from harness.run.heartbeat import Heartbeat, beat_interval

    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)  # served while it lives
        port.value = store.port
    while port.value == 0:
        time.sleep(0.01)

    def on_hang(error: dict) -> None:  # under SLURM: status.json, then the job's tasks are killed
        Path(out, f"verdict-{rank}.json").write_text(json.dumps(error))
        time.sleep(3600)  # the kill's place: this rank (and the store it may host) stays up till the test ends

    watch = StoreWatch(rank, world_size, "127.0.0.1", port.value, timeout_s, on_hang, connect_timeout_s=30)
    heartbeat = Heartbeat(watch.publish, beat_interval(timeout_s)).start()
    while True:
        heartbeat.begin_step()
        time.sleep(0.02)
        steps[rank] += 1
        while min(steps) < steps[rank]:  # blocked on a stopped peer: inside the step, still beating
            time.sleep(0.005)
        heartbeat.end_step()


@pytest.mark.slow
@pytest.mark.parametrize("stop", [1, 0])
def test_store_watch_names_the_stopped_rank(tmp_path, stop):
    """Rank 1 stopped: rank 0's judge names it, not rank 2 (blocked, beating). Rank 0 stopped (the store's host):
    the others name rank 0."""
    from harness.launch import warm

    world, timeout_s = 3, 5.0
    ctx = warm.context()
    port, steps = ctx.Value("i", 0), ctx.Array("q", world, lock=False)
    procs = [warm.process(ctx, _store_rank, (r, world, port, steps, str(tmp_path), timeout_s), f"rank{r}")
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 60
        while min(steps) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert min(steps) >= 30, "the fake ranks never stepped"
        os.kill(procs[stop].pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        judges = [0] if stop == 1 else [1, 2]
        files = [tmp_path / f"verdict-{r}.json" for r in judges]
        while not all(f.exists() for f in files) and time.monotonic() - stopped_at < timeout_s + 15:
            time.sleep(0.05)
        took = time.monotonic() - stopped_at
        assert all(f.exists() for f in files), f"no verdict {took:.1f} s after SIGSTOP"
        assert took <= timeout_s + 6, took
        for f in files:
            assert json.loads(f.read_text()) == {"message": f"rank {stop} made no progress for 5 s (stopped?)",
                                                 "rank": stop}
        assert not any((tmp_path / f"verdict-{r}.json").exists() for r in range(world) if r not in judges)
    finally:
        _release([p.pid for p in procs])
        for p in procs:
            p.join(10)
