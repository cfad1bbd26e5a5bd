"""Benchmark scores of time to target: AlgoPerf's performance profiles and score, and MLPerf's olympic mean."""

from __future__ import annotations

import math

import numpy as np

from harness.report.stats import Values

#: AlgoPerf's largest performance ratio that still scores (Dahl et al. 2023, "Benchmarking Neural Network Training
#: Algorithms", section 4.5).
R_MAX = 4.0


def performance_ratios(times: np.ndarray) -> np.ndarray:
    """times: (submissions x problems), the time to target of each submission on each problem, NaN or +inf where
    it missed -> ratios (same shape): r_{s,p} = t_{s,p} / min_s' t_{s',p}.

    A missed target counts as +inf, so its ratio is +inf; a problem that no submission solved gives +inf to all.
    """
    t = np.asarray(times, dtype=float)
    if t.ndim != 2:
        raise ValueError(f"performance_ratios: times must be 2-D (submissions x problems), not {t.shape}")
    t = np.where(np.isnan(t), np.inf, t)
    best = t.min(axis=0, keepdims=True) if t.size else t
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = t / best
    return np.where(np.isfinite(best) & np.isfinite(t), ratios, np.inf)


def performance_profile(ratios: np.ndarray, taus: Values) -> np.ndarray:
    """ratios: (submissions x problems), taus: 1-D (points) -> (submissions x points):
    rho_s(tau) = (1/P) #{p : r_{s,p} <= tau}, the share of problems that s solved within tau times the best time."""
    r = np.asarray(ratios, dtype=float)
    tau = np.asarray(taus, dtype=float)
    return (r[:, :, None] <= tau[None, None, :]).mean(axis=1)


def algoperf_score(ratios: np.ndarray, r_max: float = R_MAX) -> np.ndarray:
    """ratios: (submissions x problems) -> (submissions,): B_s = 1/(r_max - 1) · integral_1^r_max rho_s(tau) dtau.

    rho_s is a step function, so the integral is exact: each problem contributes (r_max - r_{s,p}) / (r_max - 1)
    when r_{s,p} <= r_max (r >= 1 always) and 0 otherwise, averaged over the P problems. 1 means the fastest on
    every problem; 0 means never within r_max times the fastest (or never reaching the target).
    """
    r = np.asarray(ratios, dtype=float)
    contribution = np.where(r <= r_max, (r_max - np.maximum(r, 1.0)) / (r_max - 1.0), 0.0)
    return contribution.mean(axis=1)


def olympic_mean(times: Values) -> float:
    """times: 1-D (runs of one submission on one workload, one per seed), NaN or +inf where a run missed the target
    -> MLPerf's result: the mean after dropping the fastest and the slowest run.

    At most one run may miss: it is then the slowest, and is dropped. NaN with fewer than 3 runs or more than one
    miss (MLPerf Training rules, "Scoring": olympic averaging of the runs' times to target).
    """
    t = np.asarray(times, dtype=float).ravel()
    t = np.where(np.isnan(t), np.inf, t)
    if len(t) < 3 or int((~np.isfinite(t)).sum()) > 1:
        return math.nan
    return float(np.sort(t)[1:-1].mean())
