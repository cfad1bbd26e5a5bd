"""Time to target as survival: the Kaplan–Meier estimate of the fraction of runs still short of the target."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.report.stats import Values


@dataclass(frozen=True)
class KaplanMeier:
    """The estimate at each distinct event time: `times` (ascending), `at_risk` (n_i), `events` (d_i) and
    `survival` (S(t_i), the fraction still short of the target just after t_i)."""

    times: np.ndarray
    at_risk: np.ndarray
    events: np.ndarray
    survival: np.ndarray

    def at(self, t: Values) -> np.ndarray:
        """S(t) at each of `t` (a step function, right-continuous: 1 before the first event time)."""
        index = np.searchsorted(self.times, np.asarray(t, dtype=float), side="right")
        return np.concatenate([[1.0], self.survival])[index]


def kaplan_meier(times: Values, reached: Values) -> KaplanMeier:
    """times: 1-D (runs), each run's time to target where it reached it, else the time it was censored at (its train
    time); reached: 1-D bools (True: an event, the target reached at that time) -> the Kaplan–Meier estimate

        S(t) = prod over event times t_i <= t of (1 - d_i / n_i),

    where d_i is the number of runs that reached the target at t_i (ties counted together) and n_i the number still
    at risk at t_i: runs whose time is at least t_i, so a run censored at t_i counts as at risk then (events come
    before censoring at a tie). 1 - S(t) is the fraction of runs at the target by time t; a run censored at c leaves
    the runs at risk after c, and when the last time is censored S never reaches 0. A run that can never reach the
    target (it diverged) is censored at +inf: it stays at risk at every event time, so 1 - S(t) counts it as a run
    that did not arrive. Raises ValueError for unequal lengths or a time that is NaN or negative.
    """
    t = np.asarray(times, dtype=float).ravel()
    hit = np.asarray(reached, dtype=bool).ravel()
    if t.shape != hit.shape:
        raise ValueError(f"kaplan_meier: times and reached must have one length, not {t.shape} and {hit.shape}")
    if np.isnan(t).any() or (t < 0).any():
        raise ValueError("kaplan_meier: every time must be a number >= 0")
    event_times = np.unique(t[hit])
    at_risk = np.array([(t >= u).sum() for u in event_times], dtype=int)
    events = np.array([(hit & (t == u)).sum() for u in event_times], dtype=int)
    survival = np.cumprod(1.0 - events / at_risk) if len(event_times) else np.array([], dtype=float)
    return KaplanMeier(event_times, at_risk, events, survival)
