"""The pipeline benchmarks' rank functions run end to end on a tiny model and return every number they print
(benchmarks/measure/pipeline_breakdown.py, benchmarks/asv/pipeline_ranks.py); their timings are not asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from _dist import spawn

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "measure"), str(ROOT / "benchmarks" / "asv")]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_the_breakdown_splits_both_sides_steps(schedule):
    from pipeline_breakdown import breakdown

    ranks = spawn(breakdown, 2, schedule, 2, 32, timeout=300)
    for rank, result in enumerate(ranks):
        for side in ("ours", "torch"):
            parts = result[side]
            assert parts["step_s"] > 0 and parts["page_faults"] >= 0, (rank, side, parts)
            assert parts["forward"] > 0 and parts["backward"] > 0 and parts["update"] > 0, (rank, side, parts)
            # the parts are timed inside the step (2 steps: their median is their mean)
            assert sum(v for k, v in parts.items() if k not in ("step_s", "page_faults")) <= parts["step_s"] * 1.01


def test_the_peer_benchmark_reports_times_faults_and_traces_of_every_variant():
    from pipeline_ranks import VARIANTS, pipeline_against_torch

    ranks = spawn(pipeline_against_torch, 2, 1, 1, 32, 8, 16, 8, 2, "fused", timeout=300, allocator="system")
    for result in ranks:
        assert set(VARIANTS) <= set(result) and set(result["page_faults"]) == set(VARIANTS)
        assert all(len(result[name]) == 1 and result[name][0] > 0 for name in VARIANTS)
        assert len(result["gpipe_traces"]) == 1 and len(result["interleaved_traces"]) == 1
