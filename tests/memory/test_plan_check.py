"""harness/report/plan_check.py: a rank's plan against its allocator peak, with the CPU meter's resolution below the
peak and MAX_RATIO above it."""

from __future__ import annotations

import pytest

from harness.report.plan_check import MAX_RATIO, METER_SLACK_BYTES, RankCheck


def _check(plan: int, peak: int) -> RankCheck:
    return RankCheck("run", "m", "w", 0, {"total": plan}, peak)


@pytest.mark.parametrize(("plan", "ok"), [
    (100_000, True),
    (100_000 - METER_SLACK_BYTES, True),
    (100_000 - METER_SLACK_BYTES - 1, False),
    (int(MAX_RATIO * 100_000), True),
    (int(MAX_RATIO * 100_000) + 1, False),
])
def test_the_gate_is_the_peak_less_the_meters_resolution_to_max_ratio_times_it(plan, ok):
    assert _check(plan, 100_000).ok is ok

