"""The paired t interval of a ratio (on log ratios) or a difference: a point for exact pairs, scipy's t quantile,
and a time that never comes handled as a certainty, not a number."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from harness.report.paired import interval_name, paired_interval, t_interval


def test_exact_ratios_and_differences_are_a_point() -> None:
    assert paired_interval(np.array([2.0, 4, 6]), np.array([1.0, 2, 3]), "ratio") == pytest.approx((2.0, 2.0, 2.0))
    assert paired_interval(np.array([2.0, 3, 5]), np.array([1.0, 2, 4]), "diff") == pytest.approx((1.0, 1.0, 1.0))
    estimate, low, high = paired_interval(np.array([1.0]), np.array([2.0]), "ratio")
    assert estimate == 0.5 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="kind"):
        paired_interval(np.array([1.0]), np.array([1.0]), "sum")


def test_the_interval_is_students_t_on_log_ratios_and_on_differences() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.exponential(size=6) + 1, rng.exponential(size=6) + 1
    d = np.log(a / b)
    half = scipy_stats.t.ppf(0.975, 5) * d.std(ddof=1) / math.sqrt(6)
    assert paired_interval(a, b, "ratio") == pytest.approx(
        (math.exp(d.mean()), math.exp(d.mean() - half), math.exp(d.mean() + half)))
    low, high = scipy_stats.ttest_1samp(a - b, 0).confidence_interval(0.95)
    assert paired_interval(a, b, "diff")[1:] == pytest.approx((low, high))
    # at a smaller alpha the interval widens, and the vectorised form gives the same rows
    assert paired_interval(a, b, "diff", alpha=0.005)[1] < low
    rows = np.stack([a - b, b - a])
    assert t_interval(rows)[1] == pytest.approx([low, -high])


def test_a_time_that_never_comes_is_a_certainty_on_its_side_and_undecided_on_both() -> None:
    inf = math.inf
    assert paired_interval(np.array([inf, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]), "ratio") == (inf, inf, inf)
    assert paired_interval(np.array([1.0, 2.0]), np.array([inf, 2.0]), "ratio") == (0.0, 0.0, 0.0)
    assert paired_interval(np.array([1.0, 2.0]), np.array([inf, 2.0]), "diff") == (-inf, -inf, -inf)
    assert paired_interval(np.array([inf, 2.0, 4.0]), np.array([inf, 1.0, 2.0]), "ratio") == pytest.approx(
        (2.0, 2.0, 2.0))  # both never: that pair is left out
    assert all(math.isnan(x) for x in paired_interval(np.array([inf, 2.0]), np.array([1.0, inf]), "ratio"))
    assert all(math.isnan(x) for x in paired_interval(np.array([0.0, 2.0]), np.array([1.0, 1.0]), "ratio"))


def test_the_interval_says_what_it_is() -> None:
    assert interval_name("ratio") == "95% paired t, log ratio"
    assert interval_name("diff", 0.025 / 3, 3) == "98.3% paired t, difference (3 looks, Bonferroni)"
