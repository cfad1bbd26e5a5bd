"""The Kaplan–Meier estimate of time to target (harness/report/survival.py) against a case worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.report.survival import kaplan_meier


def test_kaplan_meier_with_censoring_and_ties_matches_the_hand_computed_steps() -> None:
    # Seven runs: events at 2, 3, 3 and 6; censored at 3 (a tie with two events), 5 and 8.
    # t=2: n=7, d=1 -> S = 6/7;  t=3: n=6 (the run censored at 3 is still at risk), d=2 -> S = 6/7 * 4/6 = 4/7;
    # t=6: n=2 (the runs at 6 and 8), d=1 -> S = 4/7 * 1/2 = 2/7. The last time is censored: S stays at 2/7.
    km = kaplan_meier([3, 2, 3, 3, 5, 6, 8], [True, True, True, False, False, True, False])
    assert km.times.tolist() == [2, 3, 6]
    assert km.at_risk.tolist() == [7, 6, 2] and km.events.tolist() == [1, 2, 1]
    assert km.survival == pytest.approx([6 / 7, 4 / 7, 2 / 7])
    assert km.at([0, 1.9, 2, 4, 5, 6, 100]) == pytest.approx([1, 1, 6 / 7, 4 / 7, 4 / 7, 2 / 7, 2 / 7])


def test_a_run_that_never_reaches_stays_at_risk_and_no_event_means_no_step() -> None:
    # A diverged run is censored at +inf: 1 of 3 reached, so 1 - S = 1/3 (censoring it at 1 s would give 1/2).
    assert 1 - kaplan_meier([2.0, 2.4, math.inf], [True, False, False]).survival[-1] == pytest.approx(1 / 3)
    assert 1 - kaplan_meier([2.0, 2.4, 1.0], [True, False, False]).survival[-1] == pytest.approx(1 / 2)
    none = kaplan_meier([1.0, 2.0], [False, False])
    assert len(none.times) == 0 and none.at([5.0]).tolist() == [1.0]
    everyone = kaplan_meier(np.array([1.0, 1.0]), np.array([True, True]))
    assert everyone.survival.tolist() == [0.0]
    with pytest.raises(ValueError, match="one length"):
        kaplan_meier([1.0], [True, False])
    with pytest.raises(ValueError, match=">= 0"):
        kaplan_meier([math.nan], [False])
