"""Tests of the report's statistics: hand-computed cases, and agreement with scipy and plain re-implementations of
rliable's, AlgoPerf's and MLPerf's formulas on random data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as scipy_stats

from harness.report import performance_profiles, stats


def plain_iqm(values: np.ndarray) -> float:
    """The IQM as its definition reads: sort, cut floor(n/4) from each end, average the rest."""
    ordered = np.sort(np.asarray(values, dtype=float).ravel())
    cut = len(ordered) // 4
    return float(ordered[cut:len(ordered) - cut].mean())


# --- IQM and the stratified bootstrap ---

def test_iqm_of_hand_computed_cases():
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert stats.iqm([1, 2, 3, math.inf]) == pytest.approx(2.5)  # a missed target in the top quarter is cut
    assert stats.iqm([1, 2, 9]) == pytest.approx(4.0)  # fewer than 4 values: the mean
    assert stats.iqm(np.array([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [4.0, 8.0]])) == pytest.approx(4.5)


@pytest.mark.parametrize("n", [4, 5, 7, 10, 33])
def test_iqm_matches_its_definition_on_random_data(n):
    values = np.random.default_rng(n).normal(size=n)
    assert stats.iqm(values) == pytest.approx(plain_iqm(values))


def test_stratified_bootstrap_of_constant_tasks_is_a_point():
    scores = np.array([[0.9, 0.5], [0.9, 0.5], [0.9, 0.5]])  # runs x tasks
    point, low, high = stats.stratified_bootstrap_ci(scores)
    assert point == low == high == pytest.approx(0.7)


def test_stratified_bootstrap_matches_a_loop_over_resamples_and_tasks():
    """rliable's algorithm written as loops, drawing the same indices: each resample draws every task's runs with
    replacement within the task, pools them and takes the IQM; the interval is the 2.5th and 97.5th percentiles."""
    rng = np.random.default_rng(1)
    tasks = [rng.normal(size=5), rng.normal(2, 1, size=3), rng.normal(-1, 3, size=8)]
    n_boot = 500
    point, low, high = stats.stratified_bootstrap_ci(tasks, n_boot=n_boot, seed=7)
    draws = np.random.default_rng(7)
    indices = [draws.integers(0, len(task), size=(n_boot, len(task))) for task in tasks]
    resampled = [plain_iqm(np.concatenate([task[idx[b]] for task, idx in zip(tasks, indices, strict=True)]))
                 for b in range(n_boot)]
    assert point == pytest.approx(plain_iqm(np.concatenate(tasks)))
    assert (low, high) == pytest.approx(tuple(np.percentile(resampled, [2.5, 97.5])))


def test_stratified_bootstrap_of_one_task_agrees_with_scipy_bootstrap():
    values = np.random.default_rng(3).exponential(size=12)
    _, low, high = stats.stratified_bootstrap_ci([values], n_boot=20_000, seed=0)
    ours = scipy_stats.bootstrap((values,), lambda x, axis: scipy_stats.trim_mean(x, 0.25, axis=axis),
                                 n_resamples=20_000, method="percentile", rng=np.random.default_rng(1))
    spread = ours.confidence_interval.high - ours.confidence_interval.low
    assert low == pytest.approx(ours.confidence_interval.low, abs=0.05 * spread)
    assert high == pytest.approx(ours.confidence_interval.high, abs=0.05 * spread)


def test_bootstrap_of_the_mean_agrees_with_scipy_bootstrap():
    values = np.random.default_rng(4).normal(size=6)
    low, high = stats.bootstrap_ci95(values, n_boot=20_000)
    ours = scipy_stats.bootstrap((values,), np.mean, n_resamples=20_000, method="percentile",
                                 rng=np.random.default_rng(2)).confidence_interval
    spread = ours.high - ours.low
    assert (low, high) == pytest.approx((ours.low, ours.high), abs=0.05 * spread)
    assert stats.bootstrap_ci95([1.0]) == (pytest.approx(math.nan, nan_ok=True),) * 2


def test_percentile_interval_handles_infinite_samples():
    assert stats.percentile_interval(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 0.5) == pytest.approx((2.0, 4.0))
    low, high = stats.percentile_interval(np.array([1.0] * 10 + [math.inf] * 90))
    assert low == 1.0 and high == math.inf


# --- probability of improvement ---

def test_probability_of_improvement_by_hand():
    # pairs of [1, 2, 3] against [2, 2]: 1<2 twice, 2=2 twice (one half each), 3>2 twice -> 3 / 6
    assert stats.probability_of_improvement([[1, 2, 3]], [[2, 2]])[0] == pytest.approx(0.5)
    assert stats.probability_of_improvement([[3, 4]], [[1, 2]])[0] == pytest.approx(1.0)
    # averaged over tasks: 1.0 on the first, 0.0 on the second
    p, low, high = stats.probability_of_improvement([[3, 4], [0, 0]], [[1, 2], [5, 6]])
    assert p == pytest.approx(0.5) and low <= 0.5 <= high
    assert stats.probability_of_improvement([[math.inf]], [[math.inf]])[0] == 0.5  # two misses tie


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_probability_of_improvement_is_mann_whitney_u_over_nm(seed):
    rng = np.random.default_rng(seed)
    tasks_x = [rng.integers(0, 6, size=rng.integers(2, 9)).astype(float) for _ in range(3)]  # with ties
    tasks_y = [rng.integers(0, 6, size=rng.integers(2, 9)).astype(float) for _ in range(3)]
    expected = np.mean([scipy_stats.mannwhitneyu(x, y).statistic / (len(x) * len(y))
                        for x, y in zip(tasks_x, tasks_y, strict=True)])
    p, low, high = stats.probability_of_improvement(tasks_x, tasks_y)
    assert p == pytest.approx(expected)
    assert 0 <= low <= high <= 1


# --- AlgoPerf and MLPerf ---

def test_performance_ratios_profile_and_score_by_hand():
    times = np.array([[1.0, 2.0], [2.0, math.inf], [4.0, 1.0]])  # submissions x problems
    ratios = performance_profiles.performance_ratios(times)
    assert ratios.tolist() == [[1.0, 2.0], [2.0, math.inf], [4.0, 1.0]]
    assert performance_profiles.performance_profile(ratios, [1.0, 2.0, 4.0]).tolist() == [[0.5, 1.0, 1.0],
                                                                                          [0.0, 0.5, 0.5],
                                                                                          [0.5, 0.5, 1.0]]
    # B = mean over problems of (4 - r) / 3 where r <= 4
    assert performance_profiles.algoperf_score(ratios) == pytest.approx([(1 + 2 / 3) / 2, (2 / 3) / 2, (0 + 1) / 2])
    unsolved = performance_profiles.performance_ratios(np.array([[math.nan], [math.inf]]))
    assert np.isinf(unsolved).all()


def test_algoperf_score_is_the_integral_of_the_profile():
    rng = np.random.default_rng(6)
    times = rng.exponential(size=(4, 9)) + 0.1
    times[rng.random(size=times.shape) < 0.2] = math.inf
    ratios = performance_profiles.performance_ratios(times)
    scores = performance_profiles.algoperf_score(ratios)
    for s in range(len(times)):
        breaks = sorted(r for r in ratios[s] if 1 < r < 4)
        area, _ = integrate.quad(lambda tau, s=s: performance_profiles.performance_profile(ratios[s:s + 1],
                                                                                           [tau])[0, 0],
                                 1, 4, points=breaks or None, limit=200)
        assert scores[s] == pytest.approx(area / 3, abs=1e-6)


def test_olympic_mean_by_hand():
    assert performance_profiles.olympic_mean([3, 1, 2, 10]) == pytest.approx(2.5)
    assert performance_profiles.olympic_mean([1, math.nan, 2, 3]) == pytest.approx(2.5)  # one miss: the slowest dropped
    assert math.isnan(performance_profiles.olympic_mean([1, math.inf, 2, math.nan]))  # two misses: no result
    assert math.isnan(performance_profiles.olympic_mean([1, 2]))  # too few runs


@pytest.mark.parametrize("n", [3, 5, 10])
def test_olympic_mean_is_a_trimmed_mean_of_one_run_each_side(n):
    times = np.random.default_rng(n).exponential(size=n)
    assert performance_profiles.olympic_mean(times) == pytest.approx(scipy_stats.trim_mean(times, 1.5 / n))
