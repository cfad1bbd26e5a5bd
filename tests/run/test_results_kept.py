"""Results are never stale, lost or mixed: --resume keeps a completed run only when its stored spec is the run the
suite asks for now; a run into a folder that holds completed results is refused without --resume or --overwrite;
--overwrite moves the earlier folders aside, never deletes them; the page marks a run whose spec.json is not what the
suite.toml beside it asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SUITE = """name = "kept"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 1
[budget]
max_steps = {steps}
[defaults]
lr = {lr}
[[run]]
method = "sgd"
"""

RUN = "sgd-digits-mlp-w1-s0"


@pytest.fixture
def dtbench(dtbench_here):
    return dtbench_here


def write(tmp_path: Path, steps: int = 2, lr: float = 0.05) -> Path:
    path = tmp_path / "kept.toml"
    path.write_text(SUITE.format(steps=steps, lr=lr))
    return path


def train_steps(run_dir: Path) -> int:
    return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line)


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    """One completed run of the suite (2 steps, lr 0.05) in a folder of its own; each test copies it."""
    from harness.cli import main

    tmp = tmp_path_factory.mktemp("first")
    assert main(["run", str(write(tmp)), "--out", str(tmp / "out"), "--quiet"]) == 0
    return tmp / "out"


def copy_of(first: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(first, tmp_path / "out")
    return tmp_path / "out"


@pytest.mark.parametrize("change, field", [({"lr": 0.1}, "params.lr 0.05 -> 0.1"),
                                           ({"steps": 3}, "budget.max_steps 2 -> 3")])
def test_resume_runs_again_a_completed_run_whose_spec_changed(first, tmp_path, dtbench, change, field):
    out = copy_of(first, tmp_path)
    result = dtbench("run", str(write(tmp_path, **change)), "--out", str(out), "--quiet", "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"completed earlier with another spec ({field})" in result.stdout
    run_dir = out / "kept" / RUN
    spec = json.loads((run_dir / "spec.json").read_text())
    assert (spec["params"]["lr"], spec["budget"]["max_steps"]) == (change.get("lr", 0.05), change.get("steps", 2))
    assert train_steps(run_dir) == change.get("steps", 2)
    earlier = list((out / "kept" / ".earlier").iterdir())
    assert len(earlier) == 1 and train_steps(earlier[0] / RUN) == 2  # the old results kept, with their suite.toml
    assert "lr = 0.05" in (earlier[0] / "suite.toml").read_text() and "max_steps = 2" in \
        (earlier[0] / "suite.toml").read_text()


def test_resume_keeps_a_completed_run_whose_spec_is_unchanged(first, tmp_path, dtbench):
    out = copy_of(first, tmp_path)
    before = (out / "kept" / RUN / "metrics.jsonl").read_bytes()
    result = dtbench("run", str(write(tmp_path)), "--out", str(out), "--quiet", "--resume", cwd=tmp_path)
    assert result.returncode == 0 and "completed earlier, skipped (--resume)" in result.stdout, result.stdout
    assert (out / "kept" / RUN / "metrics.jsonl").read_bytes() == before
    assert not (out / "kept" / ".earlier").exists()


def test_a_second_run_without_resume_is_refused_and_keeps_the_results(first, tmp_path, dtbench):
    out = copy_of(first, tmp_path)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = dtbench("run", str(write(tmp_path)), "--out", str(out), "--quiet", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "--overwrite" in lines[0], result.stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing written


def test_overwrite_moves_the_earlier_results_aside(first, tmp_path, dtbench):
    out = copy_of(first, tmp_path)
    old = (out / "kept" / RUN / "metrics.jsonl").read_bytes()
    result = dtbench("run", str(write(tmp_path, lr=0.2)), "--out", str(out), "--quiet", "--overwrite", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "moved aside" in result.stdout
    (earlier,) = (out / "kept" / ".earlier").iterdir()
    assert (earlier / RUN / "metrics.jsonl").read_bytes() == old
    assert json.loads((out / "kept" / RUN / "spec.json").read_text())["params"]["lr"] == 0.2
    # the page reads the suite folder's runs only, never what was set aside
    from harness.results import load_suite

    assert [r.spec["params"]["lr"] for r in load_suite(out / "kept")] == [0.2]


def test_resume_and_overwrite_together_are_refused(tmp_path, dtbench):
    result = dtbench("run", str(write(tmp_path)), "--out", str(tmp_path / "out"), "--resume", "--overwrite",
                     cwd=tmp_path)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_page_marks_a_run_that_suite_toml_no_longer_asks_for(first, tmp_path, dtbench):
    """An edit of the suite, then `--resume --only` of another run: the first run's results stay, under a suite.toml
    that now asks for another lr; the page says so, naming the run and the field."""
    out = copy_of(first, tmp_path)
    suite = tmp_path / "kept.toml"
    suite.write_text(SUITE.format(steps=2, lr=0.5) + '[[run]]\nmethod = "ddp"\nworld_size = 2\n')
    result = dtbench("run", str(suite), "--out", str(out), "--quiet", "--resume", "--only", "ddp*", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    result = dtbench("report", str(out / "kept"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    page = (out / "kept" / "report" / "index.html").read_text()
    assert "no longer asks for" in page
    assert f"<code>{RUN}</code>: params.lr 0.5 -&gt; 0.05" in page
    assert "<code>ddp-digits-mlp-w2-s0</code>" not in page  # the run it asks for as it ran
