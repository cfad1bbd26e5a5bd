"""Statistics over seeds: means with Student-t intervals, and the percentile bootstrap of a mean."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd


def mean_ci95(values: Sequence[float] | pd.Series) -> tuple[float, float, int]:
    """values: 1-D (runs) -> (mean, 95% Student-t confidence interval half-width, n) of the finite ones.

    The half-width is NaN with fewer than two finite values; all three are NaN/0 with none.
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(finite[0]), math.nan, 1
    from scipy import stats

    half = stats.t.ppf(0.975, n - 1) * finite.std(ddof=1) / math.sqrt(n)
    return float(finite.mean()), float(half), n

def bootstrap_ci95(values: Sequence[float] | pd.Series, n_boot: int = 1000,
                   seed: int = 0) -> tuple[float, float]:
    """values: 1-D (seeds) -> (low, high) of the 95% percentile-bootstrap interval of their mean.

    The statistic of seaborn's errorbar=("ci", 95) (n_boot resamples, 2.5th and 97.5th percentiles),
    vectorized: seaborn resamples in a Python loop, which takes seconds per curve at 100 grid points.
    Seeded, so a report repeats exactly.
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if len(finite) < 2:
        return math.nan, math.nan
    resamples = np.random.default_rng(seed).integers(0, len(finite), size=(n_boot, len(finite)))
    low, high = np.percentile(finite[resamples].mean(axis=1), [2.5, 97.5])
    return float(low), float(high)
