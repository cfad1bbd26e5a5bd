"""Censored times: a run that missed its target has a time to target known only to exceed its train time T."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.report.paired import ALPHA, paired_interval

#: The relations a claim may state (harness/claims/model.py): method against baseline.
LOWER = ("ratio_le", "diff_le", "absdiff_le")


@dataclass(frozen=True)
class CensoredPairs:
    """Paired values (pairs: the same workload, network and seed on both sides), 1-D arrays of one length.

    method, baseline: the value where it is known, else the bound T (the run's train time: the true value is > T);
    method_censored, baseline_censored: True where the value is only that bound.
    """

    method: np.ndarray
    baseline: np.ndarray
    method_censored: np.ndarray
    baseline_censored: np.ndarray

    @property
    def censored(self) -> np.ndarray:
        """True for a pair with either side censored."""
        return self.method_censored | self.baseline_censored

    def extreme(self, method_high: bool, baseline_high: bool) -> tuple[np.ndarray, np.ndarray]:
        """The pairs with every censored value at one end of [T, inf): +inf where `*_high`, T otherwise."""
        method = np.where(self.method_censored & method_high, math.inf, self.method)
        baseline = np.where(self.baseline_censored & baseline_high, math.inf, self.baseline)
        return method, baseline


def statistic(kind: str, method: np.ndarray, baseline: np.ndarray) -> float:
    """kind 'ratio': mean(method) / mean(baseline); 'diff' (and 'absdiff'): mean(method - baseline)."""
    return float(method.mean() / baseline.mean()) if kind == "ratio" else float((method - baseline).mean())


def holds(relation: str, value: float, x: float) -> bool:
    """Does the statistic x satisfy the relation to `value`? (absdiff_le: |x| <= value)."""
    if relation == "absdiff_le":
        return abs(x) <= value
    return x <= value if relation in LOWER else x >= value


def violates(relation: str, value: float, low: float, high: float) -> bool:
    """Does every x in [low, high] violate the relation to `value`?"""
    if relation == "absdiff_le":
        return high < -value or low > value
    return not holds(relation, value, low) and not holds(relation, value, high)


def interval_verdict(relation: str, value: float, low: float, high: float) -> str:
    """PASS when the whole interval [low, high] satisfies the relation, FAIL when it wholly violates it,
    INCONCLUSIVE otherwise (and when the interval is unknown)."""
    if math.isnan(low) or math.isnan(high):
        return "INCONCLUSIVE"
    if holds(relation, value, low) and holds(relation, value, high):
        return "PASS"
    return "FAIL" if violates(relation, value, low, high) else "INCONCLUSIVE"


def kind_of(relation: str) -> str:
    """'ratio_le' -> 'ratio', 'absdiff_le' -> 'diff' (the statistic; absdiff judges its absolute value)."""
    return "ratio" if relation.startswith("ratio") else "diff"


@dataclass(frozen=True)
class BoundVerdict:
    """A verdict on pairs some of which are censored: `verdict`, and the estimate and interval at the end of the
    bounds that decided it (NaN when nothing decided it); `side` is 'worst' (every censored value against the
    claim: a PASS there holds whatever the true times are), 'best' (every censored value for it: a FAIL there fails
    whatever they are) or ''."""

    verdict: str
    estimate: float
    low: float
    high: float
    side: str


def bound_verdict(pairs: CensoredPairs, relation: str, value: float, alpha: float = ALPHA) -> BoundVerdict:
    """The verdict that holds for every true value of the censored times (each somewhere in (T, inf)), its interval
    the paired t interval at `alpha` on each side (harness/report/paired.py).

    Against the claim ('worst'), a censored time goes to whichever end of [T, inf) hurts it: for a `_le` relation
    the method's to +inf and the baseline's to T, so the ratio is as large as it can be; for `_ge` the mirror. PASS
    needs a worst case whose interval wholly satisfies the relation and in which every censored pair, alone,
    satisfies it too: a censored method therefore never passes a `_le` claim (its +inf makes the statistic +inf),
    and a censored baseline passes one only when the method's time against T already does. For the claim
    ('best'), the other ends: FAIL needs a best case whose interval wholly violates the relation, so a censored
    baseline never makes a `_le` claim fail, and a missed method fails it only when even its train time T is too
    slow. A value that is +inf and not censored (a diverged run: it never reaches) stays +inf at both ends, so a
    diverged method fails a `_le` claim against a baseline that arrived. absdiff_le has no one-sided bound:
    censored pairs leave it INCONCLUSIVE. Otherwise INCONCLUSIVE.
    """
    kind = kind_of(relation)
    if relation == "absdiff_le" or not pairs.censored.any():
        if pairs.censored.any():
            return BoundVerdict("INCONCLUSIVE", math.nan, math.nan, math.nan, "")
        estimate, low, high = paired_interval(pairs.method, pairs.baseline, kind, alpha)
        return BoundVerdict(interval_verdict(relation, value, low, high), estimate, low, high, "")
    le = relation in LOWER
    worst = pairs.extreme(method_high=le, baseline_high=not le)
    alone = [holds(relation, value, statistic(kind, np.array([m]), np.array([b])))
             for m, b, censored in zip(*worst, pairs.censored, strict=True) if censored]
    estimate, low, high = paired_interval(*worst, kind, alpha)
    if all(alone) and interval_verdict(relation, value, low, high) == "PASS":
        return BoundVerdict("PASS", estimate, low, high, "worst")
    best = pairs.extreme(method_high=not le, baseline_high=le)
    estimate, low, high = paired_interval(*best, kind, alpha)
    if interval_verdict(relation, value, low, high) == "FAIL":
        return BoundVerdict("FAIL", estimate, low, high, "best")
    return BoundVerdict("INCONCLUSIVE", math.nan, math.nan, math.nan, "")


def speedup_bound(label_times: np.ndarray, label_censored: np.ndarray, base_times: np.ndarray,
                  base_censored: np.ndarray) -> tuple[float, str]:
    """Paired times to target (1-D, one per seed; a censored entry holds the run's train time T) -> (bound, side):
    the speed-up, the geometric mean of the per-seed ratios baseline / label as the rankings report it (paired.py),
    is at least `bound` (side '>=') when only baseline times are censored and that bound is >= 1, at most `bound`
    ('<=') when only the label's are and it is <= 1: the bound then decides which is faster (each ratio, and so their
    geometric mean, only grows as a censored baseline time grows, or shrinks as a censored label time does). (NaN, '')
    otherwise: no censored time, both sides censored, or a bound that decides nothing."""
    base_only = base_censored.any() and not label_censored.any()
    label_only = label_censored.any() and not base_censored.any()
    if not (base_only or label_only) or not (label_times > 0).all() or not (base_times > 0).all():
        return math.nan, ""
    bound = paired_interval(base_times, label_times, "ratio")[0]  # the speed-up's own estimate, at the bounds
    if base_only and bound >= 1.0:
        return bound, ">="
    if label_only and bound <= 1.0:
        return bound, "<="
    return math.nan, ""
