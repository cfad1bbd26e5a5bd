"""Warm rank processes (harness/launch/warm.py): runs of one suite stay isolated, ranks see the launcher's
environment, workers import nothing they do not use, and the digits cache gives the same tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.data import sources
from harness.launch import warm
from harness.results import read_jsonl

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}

SUITE = """\
name = "iso"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 1
[budget]
max_epochs = 0.25
eval_every_epochs = 0.125
[[run]]
method = "qsgd"
world_size = 2
params = { bits = 4 }
[[run]]
method = "sgd"
"""
RUN_IDS = ("qsgd-digits-mlp-w2-bits4-s0", "sgd-digits-mlp-w1-s0")


def dtbench(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "harness.cli", *args, "--quiet"], env={**ENV, **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout


def results(run_dir: Path) -> tuple[list, list]:
    """Every number of a run that does not measure time: per-rank train records and the evaluations."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = sorted((r["rank"], r["step"], r["loss"], r["bytes_sent"], r["bytes_recv"]) for r in records
                   if r["kind"] == "train")
    evals = [(r["step"], r["test_accuracy"], r["test_loss"]) for r in records if r["kind"] == "eval"]
    return train, evals


@pytest.mark.slow
def test_two_runs_of_one_suite_equal_each_run_alone_bitwise(tmp_path, monkeypatch, dtbench_here):
    """Both runs fork from one warm server (the test session's, which has served other runs before), one after the
    other; then each runs again with every rank a fresh interpreter (spawn, from a fresh `dtbench run`). qsgd draws
    random numbers on every rank and step, so state carried from run to run, or a fork that differs from a fresh
    start, would show. The suite's first run also makes the digits split (cold cache), the spawned runs read it back
    from the cache."""
    path = tmp_path / "iso.toml"
    path.write_text(SUITE)
    monkeypatch.setenv("DTBENCH_CACHE_DIR", str(tmp_path / "cache"))
    done = dtbench_here("run", path, "--out", tmp_path / "suite", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    dtbench("run", str(path), "--out", str(tmp_path / "alone"), env={
        "DTBENCH_CACHE_DIR": str(tmp_path / "cache"), warm.START_METHOD_VARIABLE: "spawn"})
    for run_id in RUN_IDS:
        together, alone = tmp_path / "suite" / "iso" / run_id, tmp_path / "alone" / "iso" / run_id
        train, evals = results(together)
        assert len(train) > 5 and len(evals) >= 2
        assert (train, evals) == results(alone), run_id
        forked = [r for r in read_jsonl(together / "metrics.jsonl") if r["kind"] == "startup"]
        assert sorted(r["rank"] for r in forked) == list(range(json.loads(
            (together / "spec.json").read_text())["world_size"]))
        assert {"process", "setup", "rendezvous", "workload", "method"} <= set(forked[0]["seconds_by_phase"])


def _environment_of_rank(rank: int, world_size: int, name: str) -> str | None:
    return os.environ.get(name)


@pytest.mark.slow
def test_ranks_see_the_environment_of_their_start_not_of_the_server(monkeypatch):
    from _dist import spawn

    name = "DTBENCH_TEST_WARM_MARK"
    monkeypatch.setenv(name, "first")
    assert spawn(_environment_of_rank, 2, name) == ["first", "first"]
    monkeypatch.setenv(name, "second")  # the server, started by now, still has "first" (or nothing)
    assert spawn(_environment_of_rank, 1, name) == ["second"]
    monkeypatch.delenv(name)
    assert spawn(_environment_of_rank, 1, name) == [None]


def test_start_method_comes_from_the_variable_and_bad_values_name_it(monkeypatch):
    monkeypatch.delenv(warm.START_METHOD_VARIABLE, raising=False)
    assert warm.start_method() == "forkserver"
    monkeypatch.setenv(warm.START_METHOD_VARIABLE, "spawn")
    assert warm.start_method() == "spawn" and warm.context().get_start_method() == "spawn"
    monkeypatch.setenv(warm.START_METHOD_VARIABLE, "fork")
    with pytest.raises(ValueError, match=warm.START_METHOD_VARIABLE):
        warm.start_method()


def test_run_in_environment_replaces_the_whole_environment(monkeypatch):
    monkeypatch.setenv("DTBENCH_TEST_STALE", "1")  # monkeypatch removes both names afterwards
    monkeypatch.setenv("DTBENCH_TEST_NEW", "1")
    environ = {k: v for k, v in os.environ.items() if k != "DTBENCH_TEST_STALE"} | {"DTBENCH_TEST_NEW": "2"}
    assert warm.run_in_environment(environ, lambda: dict(os.environ), ()) == environ


@pytest.mark.slow
def test_the_launcher_and_the_preloaded_modules_import_no_plotting_cluster_or_sklearn_library():
    """What `dtbench run` imports to launch, and what every rank imports (the server's preload), leaves out
    seaborn, matplotlib, pandas, submitit and scikit-learn: the report, SLURM and a cold digits cache import
    them when they are used."""
    code = ("import sys, importlib\n"
            "from pathlib import Path\n"
            "from harness.launch import warm\n"
            "from harness.launch.suite import run_specs\n"
            "from harness.suite.expand import expand_suite\n"
            "expand_suite(Path('suites/smoke.toml'), None, None)\n"
            "for name in warm.builtin_modules(): importlib.import_module(name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'seaborn', 'matplotlib', 'pandas', 'submitit',"
            " 'sklearn'}))")
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_digits_cache_returns_the_split_bit_for_bit(monkeypatch, tmp_path):
    monkeypatch.setenv(sources.CACHE_VARIABLE, str(tmp_path))
    made = sources.digits_split(0, 0.2, "unused")
    for _ in range(2):  # a cold cache, then a warm one
        train, test = sources.digits()
        for got, want in zip((train.x, train.y, test.x, test.y), made, strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want)
    from importlib import metadata

    assert sources.digits_cache_file(0, 0.2, metadata.version("scikit-learn")).is_file()  # the warm read used it
