"""Statistics over seeds: intervals of a mean, the interquartile mean, probability of improvement.

These intervals are 95% percentile bootstraps over runs (N_BOOT resamples, seeded, so a report repeats exactly): of
the mean for per-label numbers and plots (`bootstrap_ci95`), stratified by task for the IQM and the probability of
improvement (rliable: Agarwal et al. 2021). Paired ratios and differences (claims, the rankings' speed-up) take a
paired t interval instead (harness/report/paired.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pandas as pd

Function = TypeVar("Function", bound=Callable[..., Any])

#: Bootstrap resamples of every interval (rliable asks for at least 2,000).
N_BOOT = 2000
LEVEL = 0.95

Values = Sequence[float] | np.ndarray | pd.Series


def extreme_values_shown(function: Function) -> Function:
    """`function` with numpy's float arithmetic taking extreme values as values, silently: an overflow is inf, 0/0
    and inf - inf are NaN, x/0 is inf (the tables show inf, or a blank for NaN). The report and the claims run under
    it, so a diverged run's 1e38 loss or a corrupt record's 1e308 gives an inf in a table, not a warning or a
    crash. Python's own float math (math.exp) still raises: those places guard themselves (tables.perplexity)."""
    @functools.wraps(function)
    def shown(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return function(*args, **kwargs)
    return shown  # type: ignore[return-value]


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """samples: 1-D (resamples) of a statistic -> the (low, high) percentiles that hold `level` of them.

    Linear interpolation between order statistics (numpy's default) when every sample is finite; with infinities
    (a missed target counts as +inf) the nearest order statistic, so that no inf - inf appears.
    """
    samples = np.asarray(samples, dtype=float)
    samples = samples[~np.isnan(samples)]
    if len(samples) == 0:
        return math.nan, math.nan
    tail = (1 - level) / 2
    method = "linear" if np.isfinite(samples).all() else "nearest"
    low, high = np.quantile(samples, [tail, 1 - tail], method=method)
    return float(low), float(high)


def bootstrap_ci95(values: Values, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    """values: 1-D (seeds) -> (low, high) of the 95% percentile-bootstrap interval of their mean.

    Resamples the finite values with replacement n_boot times: mean_b = mean(values[idx_b]), idx_b ~ U{0..n-1}^n;
    the interval is the 2.5th and 97.5th percentiles of the mean_b. It is the statistic of seaborn's
    errorbar=("ci", 95), vectorized (seaborn resamples in a Python loop, seconds per curve at 100 grid points), so
    plots pass it as their errorbar and every interval on the page is this one. NaN with fewer than 2 values.
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if len(finite) < 2:
        return math.nan, math.nan
    resamples = np.random.default_rng(seed).integers(0, len(finite), size=(n_boot, len(finite)))
    return percentile_interval(finite[resamples].mean(axis=1))


def iqm(values: Values, axis: int | None = None) -> float | np.ndarray:
    """The interquartile mean: the mean of the middle 50% of the values, scipy.stats.trim_mean(values, 0.25).

    values: any shape; axis None pools every value (rliable's IQM over runs x tasks), an int reduces that axis.
    With n values, floor(n/4) are cut from each end, so with fewer than 4 values it is the plain mean. +inf (a
    missed target) is a valid value: it is cut when it is among the top quarter.
    """
    from scipy import stats

    return stats.trim_mean(np.asarray(values, dtype=float), 0.25, axis=axis)


def _resample(task: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """task: 1-D (runs) -> (n_boot x runs): each row the task's runs drawn with replacement."""
    return task[rng.integers(0, len(task), size=(n_boot, len(task)))]


def as_tasks(scores: Sequence[Values] | np.ndarray) -> list[np.ndarray]:
    """scores: runs x tasks (2-D array, NaN where a task has fewer runs) or a list of 1-D arrays (one per task)
    -> one 1-D array per task, NaN dropped, empty tasks left out."""
    if isinstance(scores, np.ndarray) and scores.ndim == 2:
        columns = [scores[:, j] for j in range(scores.shape[1])]
    else:
        columns = [np.asarray(task, dtype=float).ravel() for task in scores]
    tasks = [np.asarray(c, dtype=float)[~np.isnan(np.asarray(c, dtype=float))] for c in columns]
    return [task for task in tasks if len(task)]


def stratified_bootstrap_ci(scores: Sequence[Values] | np.ndarray,
                            statistic: Callable[..., float | np.ndarray] = iqm, n_boot: int = N_BOOT,
                            seed: int = 0, level: float = LEVEL) -> tuple[float, float, float]:
    """scores: runs x tasks (see as_tasks) -> (statistic of every score, low, high): rliable's stratified
    percentile bootstrap.

    Each resample b draws, within every task j separately, n_j of its runs with replacement, pools them (sum_j n_j
    values) and computes statistic(pooled, axis=1) on all resamples at once; (low, high) are the percentiles holding
    `level` of the n_boot values. The point estimate is the statistic of all scores pooled. NaN when there is no
    score; the interval is NaN when no task has 2 runs.
    """
    tasks = as_tasks(scores)
    if not tasks:
        return math.nan, math.nan, math.nan
    point = float(statistic(np.concatenate(tasks), axis=None))
    if max(len(task) for task in tasks) < 2:
        return point, math.nan, math.nan
    rng = np.random.default_rng(seed)
    pooled = np.hstack([_resample(task, n_boot, rng) for task in tasks])
    return (point, *percentile_interval(np.asarray(statistic(pooled, axis=1), dtype=float), level))


def improvement_probability(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x: (... x n), y: (... x m) -> (...): P(X > Y) + P(X = Y) / 2 over all n·m pairs, on the last axis.

    This is the Mann–Whitney U statistic of x over n·m (scipy.stats.mannwhitneyu(x, y).statistic / (n·m)), with
    ties counting one half; +inf compares as the largest value (and equals another +inf).
    """
    x, y = np.asarray(x, dtype=float)[..., :, None], np.asarray(y, dtype=float)[..., None, :]
    return ((x > y) + 0.5 * (x == y)).mean(axis=(-2, -1))


def probability_of_improvement(method: Sequence[Values], baseline: Sequence[Values], n_boot: int = N_BOOT,
                               seed: int = 0, level: float = LEVEL) -> tuple[float, float, float]:
    """method, baseline: one 1-D array of scores per task, higher better (negate times) -> (P, low, high).

    P = (1/K) sum_k U_k / (n_k m_k): the probability that a run of the method beats a run of the baseline on the
    same task, averaged over the K tasks where both have runs (rliable's probability of improvement; U_k is the
    Mann–Whitney U of the method's n_k scores against the baseline's m_k, ties one half). The interval is the
    stratified percentile bootstrap: each resample draws both sides' runs with replacement within every task.
    NaN when no task has runs of both.
    """
    pairs = [(np.asarray(a, dtype=float), np.asarray(b, dtype=float)) for a, b in zip(method, baseline, strict=True)]
    pairs = [(a[~np.isnan(a)], b[~np.isnan(b)]) for a, b in pairs]
    pairs = [(a, b) for a, b in pairs if len(a) and len(b)]
    if not pairs:
        return math.nan, math.nan, math.nan
    point = float(np.mean([improvement_probability(a, b) for a, b in pairs]))
    if all(len(a) < 2 and len(b) < 2 for a, b in pairs):
        return point, math.nan, math.nan
    rng = np.random.default_rng(seed)
    samples = np.mean([improvement_probability(_resample(a, n_boot, rng), _resample(b, n_boot, rng))
                       for a, b in pairs], axis=0)
    return (point, *percentile_interval(samples, level))


#: What the report calls an interval when every label has at least MIN_INTERVAL_RUNS runs.
CI_WORDS = "95% CI"
#: Fewer runs than this per label and the bootstrap interval is no confidence interval (interval_words).
MIN_INTERVAL_RUNS = 3


def interval_words(fewest: int | None) -> str:
    """What the report's intervals are, given the fewest runs a label has (None: unknown): '95% CI' from 3 runs,
    'min–max of 2 seeds' with 2 (a bootstrap of 2 values resamples only them), 'no interval: 1 seed' with 1."""
    if fewest is None or fewest >= MIN_INTERVAL_RUNS:
        return CI_WORDS
    return "min–max of 2 seeds" if fewest == 2 else "no interval: 1 seed"
