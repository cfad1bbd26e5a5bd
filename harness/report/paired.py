"""Paired Student-t intervals of a ratio (on log ratios) or a difference, at a stated error on each side."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats

#: The error on each side of a plain verdict: PASS (or FAIL) at most this often when the true value is on the
#: threshold, the interval two-sided at 1 - 2 * ALPHA = 95%.
ALPHA = 0.025


def paired_interval(method: np.ndarray, baseline: np.ndarray, kind: str, alpha: float = ALPHA
                    ) -> tuple[float, float, float]:
    """method, baseline: 1-D (pairs: the same workload, network and seed on both sides) -> (estimate, low, high).

    kind "ratio": d_i = log(method_i / baseline_i), the estimate exp(mean d) (the geometric mean of the per-seed
    ratios) and the interval exp(mean d -+ t_{1-alpha, n-1} * sd(d) / sqrt(n)); kind "diff": d_i = method_i -
    baseline_i, the estimate mean d and the interval mean d -+ t * sd(d) / sqrt(n). The interval holds its level
    exactly when d is normal (lognormal noise on either side, for a ratio), with any n >= 2: a bootstrap of 3 pairs
    is the min-max of 3 values and does not (docs/claims.md, its simulation).

    An infinite value is a time that is known never to come (a diverged run's time to target): a pair with both
    sides infinite says nothing of the ratio and is left out; infinities on the method's side only make the
    statistic +inf for certain (the mean of a variable that is infinite with positive probability), on the
    baseline's only 0 (ratio) or -inf (diff), the interval that point; on both sides (in different pairs) NaN.
    A ratio of values that are not positive is NaN. NaN with no pair; the interval is NaN with one.
    """
    a, b = np.asarray(method, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_interval: method and baseline must be 1-D of one length, not {a.shape}, {b.shape}")
    if kind not in ("ratio", "diff"):
        raise ValueError(f"paired_interval: kind must be 'ratio' or 'diff', not {kind!r}")
    if np.isnan(a).any() or np.isnan(b).any():
        return math.nan, math.nan, math.nan
    a_inf, b_inf = np.isinf(a), np.isinf(b)
    keep = ~(a_inf & b_inf)
    a, b, a_inf, b_inf = a[keep], b[keep], a_inf[keep], b_inf[keep]
    if len(a) == 0 or (a_inf.any() and b_inf.any()):
        return math.nan, math.nan, math.nan
    if a_inf.any() or b_inf.any():
        sign = 1.0 if a_inf.any() else -1.0
        point = math.inf if sign > 0 else (0.0 if kind == "ratio" else -math.inf)
        return point, point, point
    if kind == "ratio":
        if (a <= 0).any() or (b <= 0).any():
            return math.nan, math.nan, math.nan
        d = np.log(a) - np.log(b)
    else:
        d = a - b
    centre, low, high = (float(x) for x in t_interval(d, alpha))
    if kind == "ratio":
        return math.exp(centre), _exp(low), _exp(high)
    return centre, low, high


def t_interval(d: np.ndarray, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d: (..., n) finite paired log ratios or differences -> (mean, low, high), each of shape (...): the Student-t
    interval mean -+ t_{1-alpha, n-1} * sd / sqrt(n) over the last axis (NaN bounds for n < 2; NaN for n = 0)."""
    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    if n == 0:
        nan = np.full(d.shape[:-1], math.nan)
        return nan, nan, nan
    centre = d.mean(axis=-1)
    if n < 2:
        nan = np.full(d.shape[:-1], math.nan)
        return centre, nan, nan
    half = scipy_stats.t.ppf(1 - alpha, n - 1) * d.std(axis=-1, ddof=1) / math.sqrt(n)
    return centre, centre - half, centre + half


def _exp(x: float) -> float:
    return math.nan if math.isnan(x) else math.exp(x)


def interval_name(kind: str, alpha: float = ALPHA, looks: int = 1) -> str:
    """What the interval is, for claims.csv and the page: e.g. '95% paired t, log ratio' or, at one of 3 looks of
    a sequential design, '98.3% paired t, difference (3 looks, Bonferroni)'."""
    level = 100 * (1 - 2 * alpha)
    text = f"{level:.3g}% paired t, {'log ratio' if kind == 'ratio' else 'difference'}"
    return text + (f" ({looks} looks, Bonferroni)" if looks > 1 else "")
