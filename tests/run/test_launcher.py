"""End to end through the CLI and the local launcher: files, determinism, a killed rank, a diverged run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _signals import with_default_sigint

from harness.results import read_jsonl

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def suite(tmp_path: Path, name: str, body: str, epochs: float = 1) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                    f"[budget]\nmax_epochs = {epochs}\neval_every_epochs = 0.5\n{body}")
    return path


def losses(run_dir: Path) -> list[tuple[int, int, float]]:
    return [(r["rank"], r["step"], r["loss"]) for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def test_runs_write_the_contract_files_and_repeat_bitwise(tmp_path, dtbench_here):
    body = '[[run]]\nmethod = "sgd"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n'
    path = suite(tmp_path, "det", body)
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        proc = dtbench_here("run", str(path), "--out", str(out), "--quiet")
        assert proc.returncode == 0, proc.stderr + proc.stdout
    for run_id in ("sgd-digits-mlp-w1-s0", "ddp-digits-mlp-w2-s0"):
        run_dir = first / "det" / run_id
        spec = json.loads((run_dir / "spec.json").read_text())
        manifest = json.loads((run_dir / "manifest.json").read_text())
        status = json.loads((run_dir / "status.json").read_text())
        assert spec["run_id"] == run_id and spec["params"]["batch_size"] == 32
        assert manifest["rerun"].startswith("dtbench rerun ") and manifest["seed"] == 0
        assert {"git", "versions", "hostname", "cpu_model", "threads", "launcher", "start_time"} <= set(manifest)
        assert status["state"] == "completed" and status["final"]["steps"] == 44
        records = read_jsonl(run_dir / "metrics.jsonl")
        evals = [r for r in records if r["kind"] == "eval"]
        assert [e["step"] for e in evals] == [0, 22, 44]
        assert all(r["train_time_s"] <= r["wall_time_s"] for r in records)
        ranks = {r["rank"] for r in records if r["kind"] == "train"}
        assert ranks == set(range(spec["world_size"]))
        # Same seed on CPU: the same curve, bit for bit.
        assert losses(run_dir) and sorted(losses(run_dir)) == sorted(losses(second / "det" / run_id))
    assert (first / "det" / "suite.toml").exists()


def test_killed_rank_fails_the_run_quickly_and_the_suite_goes_on(tmp_path):
    body = '[[run]]\nmethod = "ddp"\nworld_size = 2\n[[run]]\nmethod = "sgd"\n'
    path = suite(tmp_path, "kill", body, epochs=2000)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(out), "--quiet", "--only", "*"]
    proc = subprocess.Popen(with_default_sigint(command), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        run_dir = out / "kill" / "ddp-digits-mlp-w2-s0"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(r["kind"] == "train" and r["rank"] == 1 for r in read_jsonl(run_dir / "metrics.jsonl")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the ddp run never started training")
        pids = json.loads((run_dir / "status.json").read_text())["pids"]
        os.kill(pids["1"], signal.SIGKILL)
        killed_at = time.monotonic()
        while time.monotonic() - killed_at < 30:
            status = json.loads((run_dir / "status.json").read_text())
            if status["state"] != "running":
                break
            time.sleep(0.2)
        assert status["state"] == "failed", status
        assert time.monotonic() - killed_at < 30
        assert status["error"]["rank"] == 1 and "SIGKILL" in status["error"]["message"]
        with pytest.raises(ProcessLookupError):
            os.kill(pids["0"], 0)  # its peer is gone too
        # The sgd run after it still runs; cut it short to keep the test quick.
        sgd_dir = out / "kill" / "sgd-digits-mlp-w1-s0"
        while time.monotonic() - killed_at < 60 and not (sgd_dir / "metrics.jsonl").exists():
            time.sleep(0.2)
        assert (sgd_dir / "metrics.jsonl").exists(), "the suite did not go on to the next run"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:  # a run left alive by a failed check, or one that ignored the interrupt, would train on forever:
        if proc.poll() is None:  # end it (its ranks are tethered to it)
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0


def test_nan_loss_marks_the_run_diverged(tmp_path, dtbench_here):
    body = '[[run]]\nmethod = "sgd"\nparams = { lr = 1e30 }\n[[run]]\nmethod = "ddp"\nworld_size = 2\n' \
           'params = { lr = 1e30 }\n'
    proc = dtbench_here("run", str(suite(tmp_path, "nan", body, epochs=5)), "--out", str(tmp_path / "o"), "--quiet")
    assert proc.returncode == 1
    run_dirs = sorted((tmp_path / "o" / "nan").glob("*-digits-mlp-*"))
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "diverged", status
        assert "non-finite loss" in status["error"]["message"]
        # One rank sees it at once; the ranks act on it within two control rounds (each at most 8 steps).
        assert status["final"]["steps"] <= 1 + 2 * 8 < 5 * 44
    assert "diverged" in proc.stdout


def test_rerun_from_the_run_folder_alone(tmp_path, dtbench_here):
    path = suite(tmp_path, "re", '[[run]]\nmethod = "sgd"\n', epochs=0.5)
    assert dtbench_here("run", str(path), "--out", str(tmp_path / "a"), "--quiet").returncode == 0
    run_dir = tmp_path / "a" / "re" / "sgd-digits-mlp-w1-s0"
    path.unlink()  # the suite file is gone: the run folder must be enough
    proc = dtbench_here("rerun", str(run_dir), "--out", str(tmp_path / "b"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert losses(run_dir) == losses(tmp_path / "b" / "re" / "sgd-digits-mlp-w1-s0")
