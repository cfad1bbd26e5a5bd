"""benchmarks/checks/gpu_check.py, the GPU path's check: its suite, its one line without CUDA, and its checks
failing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "checks"))

import gpu_check  # noqa: E402


def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "checks" / "gpu_check.py")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.count("\n") == 1 and "no CUDA device" in done.stdout


def test_its_suite_is_the_smoke_suite_shortened_and_valid(tmp_path):
    from harness.suite.expand import expand_suite

    text, skipped = gpu_check.suite_text(gpu_check.SMOKE, 2.0, None)
    assert skipped == []
    path = tmp_path / "g.toml"
    path.write_text(text)
    specs = expand_suite(path, None, None)
    smoke = expand_suite(gpu_check.SMOKE, None, None)
    assert sorted({s.method for s in specs}) == sorted({s.method for s in smoke})
    assert all(s.seed == 0 and s.budget.max_epochs == 2.0 and s.checkpoint_every_steps for s in specs)
    text, skipped = gpu_check.suite_text(gpu_check.SMOKE, 2.0, 1)
    path.write_text(text)
    assert {s.world_size for s in expand_suite(path, None, None)} == {1}
    assert "ddp (2 ranks)" in skipped


@pytest.mark.slow
def test_its_checks_pass_on_a_good_run_and_catch_ranks_that_disagree(tmp_path):
    import torch

    suite = tmp_path / "s.toml"
    suite.write_text('name = "gpu-check"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                     "checkpoint_every_steps = 1000000\n[budget]\nmax_epochs = 1\neval_every_epochs = 0.5\n"
                     '[[run]]\nmethod = "ddp"\nworld_size = 2\n')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(tmp_path / "out"),
                           "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "out" / "gpu-check").glob("*/spec.json")).parent
    assert gpu_check.check_run(run_dir, 0.5, want_cuda=False) == []
    assert any("no GPU" in p for p in gpu_check.check_run(run_dir, 0.5, want_cuda=True))
    assert any("accuracy" in p for p in gpu_check.check_run(run_dir, 1.01, want_cuda=False))
    path = run_dir / "checkpoint.pt"
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = saved["ranks"][1]["method"]["model"]
    key = next(iter(model))
    model[key] = model[key] + 1e-6
    torch.save(saved, path)
    assert any("rank 1's parameters differ" in p for p in gpu_check.check_run(run_dir, 0.5, want_cuda=False))
