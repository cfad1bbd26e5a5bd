"""What a new user met on a fresh clone: a stop signal while a rank starts, `status` on the results folder, a
rerun over earlier results, failure lines, and torch's deprecated collective name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def _signalled_before_its_handler() -> None:
    """A rank's first moments: a stop signal arrives before the handler is installed, then the handler comes."""
    os.kill(os.getpid(), signal.SIGUSR2)
    from harness.launch import warm
    from harness.run.checkpoint import STOP

    STOP.install(stop_on=(signal.SIGUSR2,))
    warm.release_stop_signals()
    os._exit(0 if STOP.requested else 3)


def test_a_stop_signal_that_comes_while_a_rank_starts_stops_it_instead_of_killing_it():
    from harness.launch import warm

    ctx = warm.context()
    process = warm.process(ctx, _signalled_before_its_handler, (), "rank0")
    with warm.held_stop_signals():
        process.start()
    process.join(60)
    # Without the held mask the default action of SIGUSR2 ends the rank: exit code -12.
    assert process.exitcode == 0


def test_the_stop_signal_mask_is_restored_in_the_launching_thread():
    from harness.launch import warm

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with warm.held_stop_signals():
        assert signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def _run_folder(suite_dir: Path, run_id: str, state: str) -> None:
    run = suite_dir / run_id
    run.mkdir(parents=True)
    (run / "spec.json").write_text("{}")
    (run / "status.json").write_text(json.dumps({"state": state}))


def _dtbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], env=ENV, capture_output=True, text=True,
                          timeout=120)


def test_status_on_the_results_folder_lists_its_suites(tmp_path):
    _run_folder(tmp_path / "smoke", "sgd-s0", "completed")
    _run_folder(tmp_path / "smoke", "ddp-s0", "failed")
    _run_folder(tmp_path / "pb", "pb-s0", "completed")
    done = _dtbench("status", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.split()[:2] == ["pb", "1"] and "1 completed" in line for line in lines)
    assert any(line.split()[:2] == ["smoke", "2"] and "1 completed" in line and "1 failed" in line for line in lines)
    assert "2 suites in" in done.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _dtbench("status", str(empty))
    assert done.returncode == 0 and "no runs in" in done.stdout


def test_a_new_run_of_a_suite_refuses_completed_results_naming_both_ways_on(tmp_path):
    from harness.launch.suite import refusal
    from harness.suite.expand import expand_suite

    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\nseeds = [0, 1]\n[budget]\nmax_epochs = 1\n'
                     '[[run]]\nmethod = "sgd"\n')
    specs = expand_suite(suite, None, None)
    assert refusal(specs, tmp_path / "out") is None
    run_dir = tmp_path / "out" / "s" / specs[1].run_id
    run_dir.mkdir(parents=True)
    (run_dir / "status.json").write_text('{"state": "failed"}')
    assert refusal(specs, tmp_path / "out") is None  # a failed attempt is moved aside by the new run, not refused
    (run_dir / "status.json").write_text('{"state": "completed"}')
    note = refusal(specs, tmp_path / "out")
    assert note is not None and "holds completed results of 1 of these 2 runs" in note
    assert "--resume" in note and "--overwrite" in note


def test_a_failure_line_names_the_rank_once():
    page = _page_with_failure("rank 1 was killed by signal SIGKILL")
    assert "rank 1 was killed" in page and "failed, rank 1" not in page
    page = _page_with_failure("diverged at step 3")
    assert "failed, rank 1: diverged" in page


def _page_with_failure(message: str) -> str:
    from harness.report.page import failures_html

    failed = pd.DataFrame([{"run_id": "ddp-s0", "label": "ddp", "state": "failed", "rank": 1, "message": message}])
    return failures_html(failed)


def test_the_flat_all_gather_uses_the_current_collective_name():
    import torch

    from harness.comm import communicator

    calls = []

    class FakeDist:  # only the name lookup is checked here; tests/run/test_comm.py runs the collective for real
        @staticmethod
        def all_gather_single(out, tensor, **kwargs):
            calls.append("single")

        @staticmethod
        def all_gather_into_tensor(out, tensor, **kwargs):
            warnings.warn("deprecated", FutureWarning, stacklevel=2)

    real = communicator.dist
    communicator.dist = FakeDist
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            communicator._all_gather_single(torch.zeros(2), torch.zeros(1))
    finally:
        communicator.dist = real
    assert calls == ["single"]


@pytest.mark.slow
def test_a_compression_rank_log_carries_no_deprecation_warning(tmp_path, dtbench_here):
    suite = tmp_path / "dep.toml"
    suite.write_text('name = "dep"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                     '[budget]\nmax_epochs = 0.1\neval_every_epochs = 0.1\n'
                     '[[run]]\nmethod = "dgc"\nworld_size = 2\n')
    done = dtbench_here("run", suite, "--out", tmp_path / "out", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "out" / "dep").glob("*/logs/rank*.log"))
    assert "deprecated" not in logs.lower(), logs


def test_a_rank_from_a_column_with_gaps_is_named_as_an_int_and_once():
    from harness.report.page import failures_html

    failed = pd.DataFrame([{"run_id": "a", "label": "ddp", "state": "failed", "rank": 1.0,
                            "message": "rank 1 was killed by signal SIGKILL"},
                           {"run_id": "b", "label": "ddp", "state": "failed", "rank": None, "message": "no status"},
                           {"run_id": "c", "label": "ddp", "state": "failed", "rank": 1.0,
                            "message": "rank 12 exited with code 1"}])
    page = failures_html(failed)
    assert "1.0" not in page and "failed, rank 1: rank 1 was" not in page
    assert "failed, rank 1: rank 12 exited" in page  # "rank 1" is not "rank 12"
