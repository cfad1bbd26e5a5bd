"""Every registered method's plan against the allocator (issue 52): suites/memory-allocator.toml's runs of the method
(digits-mlp with AdamW, the GroupNorm ResNet with momentum SGD, the GPT with AdamW; 5 steps, one seed) through
`dtbench run`, and on every rank of every run, allocator peak <= plan <= MAX_RATIO x allocator peak
(harness/report/plan_check.py). Parametrised over the registry, so a method without an accurate plan, or without runs
in the suite, fails it."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from harness.registry import METHODS
from harness.report.plan_check import MAX_RATIO, rank_checks
from harness.suite.expand import expand_suite

SUITE = Path(__file__).resolve().parents[2] / "suites" / "memory-allocator.toml"


def runs_of(method: str) -> list[str]:
    """The run ids of the suite's runs of `method` (its one seed)."""
    return [spec.run_id for spec in expand_suite(SUITE) if spec.method == method]


def test_the_suite_covers_every_registered_method():
    assert {spec.method for spec in expand_suite(SUITE)} >= set(METHODS.names())


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS.names()))
def test_the_plan_is_within_the_gate_of_the_allocator_peak(method, tmp_path):
    run_ids = runs_of(method)
    assert run_ids, f"suites/memory-allocator.toml has no run of {method!r}"
    from harness.cli import main

    printed = io.StringIO()  # in this process: the ranks fork from the session's warm server
    for run_id in run_ids:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = main(["run", str(SUITE), "--out", str(tmp_path), "--quiet", "--only", run_id])
        assert code == 0, printed.getvalue()[-8000:]
    outside = []
    for run_id in run_ids:
        checks = rank_checks(tmp_path / "memory-allocator" / run_id)
        assert checks, f"{run_id}: no plan or no allocator peak recorded"
        outside += [f"{c.workload} rank {c.rank}: plan {c.planned['total']} / peak {c.peak} = {c.ratio:.3f}"
                    for c in checks if not c.ok]
    assert not outside, f"{method}: plan outside [1, {MAX_RATIO}] x the allocator peak on " + "; ".join(outside)
