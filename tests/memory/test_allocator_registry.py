"""Every registered method's plan against the allocator (issue 52): suites/memory-allocator.toml's runs of the method
(digits-mlp with AdamW, the GroupNorm ResNet with momentum SGD, the GPT with AdamW; 5 steps, one seed) through
`dtbench run`, and on every rank of every run, allocator peak (less the CPU meter's resolution, METER_SLACK_BYTES)
<= plan <= MAX_RATIO x allocator peak (harness/report/plan_check.py). Parametrised over the registry, so a method
without an accurate plan, or without runs in the suite, fails it."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from harness.registry import METHODS
from harness.report.plan_check import MAX_RATIO, rank_checks
from harness.suite.expand import expand_suite

SUITE = Path(__file__).resolve().parents[2] / "suites" / "memory-allocator.toml"

#: Methods whose plan is not yet within the gate of the allocator's peak on every rank of the suite (issue 52, still
#: open), with their plan / peak per rank (mlp, resnet, gpt) as measured on 2026-12-07 at 7b7ae1f (docs/memory.md has
#: the table). Those far outside are expected to fail, strictly: one whose plan comes within the gate fails here until
#: it leaves the list. Those within a few hundred bytes of the peak (NEAR) read either way from run to run (the CPU
#: meter misses what gloo's worker thread frees: docs/memory.md), so their expected failure is not strict. sgd,
#: single, ddp, local, gpipe, 1f1b, interleaved-1f1b and zb-h1 are held to the gate (2026-12-08, 7e8a400 and b158521:
#: every rank within it in 2 to 4 runs each).
NOT_YET: dict[str, str] = {
    "apapo": "1.000 1.000 | 1.000 1.023 | 0.9997 1.043-1.052 (2026-12-08): rank 0 of the GPT 1,024-1,384 B under: the "
             "footprint counts q's span of a qkv storage, not k's and v's tail (harness/memory/saved.py)",
    "pipedream": "1.000 1.000 | 1.000 1.061-1.065 | 0.9999 1.020-1.035 (2026-12-08): rank 0 of the GPT 1,536 B "
                 "under, as apapo's (q/k/v spans)",
    "qfb": "1.01 1.03-1.16 | 1.04-1.07 1.15-1.20 | 1.01-1.02 1.05-1.30: over (two free-running lanes: a bound)",
}
NEAR: dict[str, str] = {}


def _cases() -> list:
    cases = []
    for name in sorted(METHODS.names()):
        if name in NOT_YET:
            name = pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[name]))
        elif name in NEAR:
            name = pytest.param(name, marks=pytest.mark.xfail(strict=False, reason=NEAR[name]))
        cases.append(name)
    return cases


def runs_of(method: str) -> list[str]:
    """The run ids of the suite's runs of `method` (its one seed)."""
    return [spec.run_id for spec in expand_suite(SUITE) if spec.method == method]


def test_the_suite_covers_every_registered_method():
    assert {spec.method for spec in expand_suite(SUITE)} >= set(METHODS.names())
    assert set(NOT_YET) | set(NEAR) <= set(METHODS.names()) and not set(NOT_YET) & set(NEAR)


@pytest.mark.slow
@pytest.mark.parametrize("method", _cases())
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
