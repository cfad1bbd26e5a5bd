"""Checkpoints and exact resume with the local launcher: a stopped or killed run, resumed, ends bitwise where an
uninterrupted run of the same seed ends, and its metrics have every step once."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness.launch.local import launch
from harness.launch.suite import prepare_run_dir, run_specs
from harness.results import read_jsonl
from harness.run import checkpoint
from harness.suite.expand import expand_suite

STEPS = 600  # long enough (a few seconds) that a stop sent after epoch 2 (88 steps) lands mid-run


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    random.random(), np.random.normal(), torch.rand(3)  # a cached numpy gaussian, mid-stream states
    checkpoint.save(tmp_path / "c.pt", {"format": checkpoint.FORMAT_VERSION, "rng": checkpoint.rng_state()})
    expected = (random.random(), np.random.normal(), np.random.rand(2).tolist(), torch.rand(3))
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    checkpoint.set_rng_state(checkpoint.load(tmp_path / "c.pt")["rng"])
    got = (random.random(), np.random.normal(), np.random.rand(2).tolist(), torch.rand(3))
    assert got[:3] == expected[:3] and torch.equal(got[3], expected[3])


def test_truncate_metrics_drops_records_after_the_checkpoint_and_a_partial_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    size = path.stat().st_size
    with open(path, "a") as f:
        f.write('{"step": 3}\n{"st')
    checkpoint.truncate_metrics(path, size)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def _spec(tmp_path: Path, method: str, world_size: int, params: str = ""):
    path = tmp_path / "ck.toml"
    path.write_text(f'name = "ck"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                    f"checkpoint_every_steps = 25\n[budget]\nmax_steps = {STEPS}\nmax_epochs = 1000\n"
                    f"eval_every_epochs = 5\n[defaults]\nmomentum = 0.9\n"
                    f'[[run]]\nmethod = "{method}"\nworld_size = {world_size}\n{params}')
    return expand_suite(path)[0]


def _equal(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _final_state(run_dir: Path) -> list[dict]:
    saved = checkpoint.load(run_dir / checkpoint.CHECKPOINT_FILE)
    assert saved["step"] == STEPS
    for rank in saved["ranks"]:
        # Measured time differs between runs, and so does the number of control rounds (their period is set by
        # measured step time); the bytes and calls of every other category do not.
        ledger = rank["ledger"]
        ledger.pop("seconds")
        for counts in ledger.values():
            counts.pop("control", None)
    return saved["ranks"]


def _curve(run_dir: Path) -> tuple[list, list]:
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = sorted((r["rank"], r["step"], r["loss"], r["bytes_sent"]) for r in records if r["kind"] == "train")
    evals = [(r["step"], r["test_accuracy"], r["test_loss"]) for r in records if r["kind"] == "eval"]
    return train, evals


def _check_same_as(reference: Path, resumed: Path, world_size: int) -> None:
    _equal(_final_state(reference), _final_state(resumed), "ranks")
    ref_train, ref_evals = _curve(reference)
    train, evals = _curve(resumed)
    steps = [(r, s) for r, s, _, _ in train]
    assert steps == [(r, s) for r in range(world_size) for s in range(1, STEPS + 1)]  # no gap, no duplicate
    assert train == ref_train and evals == ref_evals
    records = read_jsonl(resumed / "metrics.jsonl")
    times = [r["train_time_s"] for r in records if r["kind"] == "train" and r["rank"] == 0]
    assert times == sorted(times)  # train time goes on across the restart


def _stop_when(run_dir: Path, epoch: float, signum: int, rank: int, wait_for_checkpoint: bool = True):
    """A progress callback that sends `signum` to rank `rank` once rank 0 has passed `epoch` (and a periodic
    checkpoint exists)."""
    sent = []

    def progress(tail) -> None:
        ready = not wait_for_checkpoint or (run_dir / checkpoint.CHECKPOINT_FILE).exists()
        if not sent and tail.epoch >= epoch and ready:
            pids = json.loads((run_dir / "status.json").read_text())["pids"]
            os.kill(pids[str(rank)], signum)
            sent.append(tail.epoch)

    return progress


@pytest.mark.slow
@pytest.mark.parametrize(("method", "world_size", "params"), [
    ("ddp", 2, ""),
    ("sgd", 1, ""),
    ("dgc", 2, "params = { density = 0.05 }"),
    ("qsgd", 2, ""),
    # stopped mid warm-up, resumed, then two lr drops: the lr is a function of the step, not of the restored state
    ("sgd", 1, 'params = { lr_schedule = "step", lr_warmup_epochs = 4 }'),
])
def test_a_run_stopped_by_usr2_resumes_bitwise(tmp_path, method, world_size, params):
    spec = _spec(tmp_path, method, world_size, params)
    reference = prepare_run_dir(spec, tmp_path / "reference")
    assert launch(spec, reference).state == "completed"

    run_dir = prepare_run_dir(spec, tmp_path / "stopped")
    stopped = launch(spec, run_dir, _stop_when(run_dir, 2.0, signal.SIGUSR2, world_size - 1))
    status = json.loads((run_dir / "status.json").read_text())
    assert stopped.state == "preempted", status
    step = checkpoint.load(run_dir / checkpoint.CHECKPOINT_FILE)["step"]
    assert 0 < step < STEPS and status["final"]["steps"] == step and "SIGUSR2" in status["note"]

    outcome = run_specs([spec], tmp_path / "stopped", resume=True, show_progress=False)[0]
    assert outcome.state == "completed"
    assert json.loads((run_dir / "manifest.json").read_text())["resumed_from_step"] == step
    _check_same_as(reference, run_dir, world_size)


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_periodic_checkpoint(tmp_path):
    spec = _spec(tmp_path, "ddp", 2)
    reference = prepare_run_dir(spec, tmp_path / "reference")
    assert launch(spec, reference).state == "completed"

    run_dir = prepare_run_dir(spec, tmp_path / "killed")
    killed = launch(spec, run_dir, _stop_when(run_dir, 2.0, signal.SIGKILL, 0))
    assert killed.state == "failed" and "SIGKILL" in killed.error["message"]
    step = checkpoint.load(run_dir / checkpoint.CHECKPOINT_FILE)["step"]
    assert 0 < step < STEPS and step % 25 == 0

    outcome = run_specs([spec], tmp_path / "killed", resume=True, show_progress=False)[0]
    assert outcome.state == "completed"
    _check_same_as(reference, run_dir, 2)


@pytest.mark.slow
def test_a_method_without_checkpoints_stops_cleanly_and_starts_over(tmp_path):
    """local with 2 ranks keeps activations in flight: it writes no checkpoint, and still stops cleanly."""
    spec = _spec(tmp_path, "local", 2)
    run_dir = prepare_run_dir(spec, tmp_path / "local")
    stopped = launch(spec, run_dir, _stop_when(run_dir, 2.0, signal.SIGUSR2, 1, wait_for_checkpoint=False))
    status = json.loads((run_dir / "status.json").read_text())
    assert stopped.state == "preempted" and "does not support checkpoints" in status["note"]
    assert not (run_dir / checkpoint.CHECKPOINT_FILE).exists()
    assert "does not support checkpoints" in (run_dir / "logs" / "rank0.log").read_text()
