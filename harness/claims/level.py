"""The verdict rule's level by simulation: how often PASS and FAIL come out with the true value on the threshold."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.claims.sequential import Design
from harness.report.censored import interval_verdict, kind_of
from harness.report.paired import t_interval

#: The cells the level is shown at (docs/claims.md): per-seed coefficients of variation and seed counts.
CVS = (0.02, 0.10, 0.30)
SEEDS = (3, 5, 10)
REPLICATES = 4000


@dataclass(frozen=True)
class Rates:
    """The share of replicates with each verdict."""

    passed: float
    failed: float
    inconclusive: float


def simulate(relation: str, value: float, truth: float, cv: float, design: Design,
             replicates: int = REPLICATES, seed: int = 0) -> Rates:
    """The verdicts of `replicates` simulated claims, judged as `evaluate.judge` judges one without censoring: at
    each of the design's looks, the paired t interval (harness/report/paired.py) of the first looks[k] seeds at
    the design's share of the error, then censored.interval_verdict; the first look that decides gives the verdict.

    Each seed's two runs carry independent lognormal noise of mean 1 and coefficient of variation `cv`
    (sigma = sqrt(log(1 + cv^2))): for a ratio relation the baseline is that noise and the method `truth` times its
    own, so the true ratio of means is `truth`; for a difference the baseline's mean is 1 and the method's
    1 + `truth`, so the true mean difference is `truth`.
    """
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log1p(cv * cv))
    noise = np.exp(rng.normal(-sigma * sigma / 2, sigma, size=(2, replicates, design.max_seeds)))
    ratio = kind_of(relation) == "ratio"
    d = np.log(truth * noise[0] / noise[1]) if ratio else (1 + truth) * noise[0] - noise[1]
    verdicts = np.full(replicates, "INCONCLUSIVE", dtype=object)
    open_ = np.ones(replicates, dtype=bool)
    for look in design.looks:
        _, low, high = t_interval(d[:, :look], design.alpha_per_look)
        if ratio:
            low, high = np.exp(low), np.exp(high)
        for r in np.flatnonzero(open_):
            verdict = interval_verdict(relation, value, float(low[r]), float(high[r]))
            if verdict != "INCONCLUSIVE":
                verdicts[r], open_[r] = verdict, False
    return Rates(*(float(np.mean(verdicts == v)) for v in ("PASS", "FAIL", "INCONCLUSIVE")))


def level_table(replicates: int = REPLICATES) -> list[dict[str, object]]:
    """The table docs/claims.md shows: for `ratio_le 1` and `diff_ge 0`, at each CV, with 3, 5 and 10 seeds and with
    the sequential design of at most 10 (looks at 3, 6, 10): PASS and FAIL with the truth on the threshold, and the
    power, P(right verdict), with the truth 20% past it on either side (a ratio of 1.2 or 1/1.2; a difference of
    -+0.2, a fifth of the baseline's mean)."""
    rows: list[dict[str, object]] = []
    designs = [(f"{n} seeds", Design((n,))) for n in SEEDS] + [("sequential, at most 10", Design((3, 6, 10)))]
    for relation, on, worse, better in (("ratio_le", 1.0, 1.2, 1 / 1.2), ("diff_ge", 0.0, -0.2, 0.2)):
        for cv in CVS:
            for name, design in designs:
                at = simulate(relation, on, on, cv, design, replicates)
                fails = simulate(relation, on, worse, cv, design, replicates, seed=1)
                passes = simulate(relation, on, better, cv, design, replicates, seed=2)
                rows.append({"relation": f"{relation} {on:g}", "cv": cv, "seeds": name, "pass": at.passed,
                             "fail": at.failed, "inconclusive": at.inconclusive,
                             "power_fail_20": fails.failed, "power_pass_20": passes.passed})
    return rows
