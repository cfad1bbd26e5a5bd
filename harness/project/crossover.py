"""Where a configuration's projected step time (or time to target) crosses the baseline's, as the link rate
varies: the rate below which compression pays."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from harness.project.progress import phase
from harness.project.suite import CalibratedSuite, Calibration, Settings
from harness.project.tables import project_one, workload_bases

#: Rates scanned for sign changes, bit/s: 1 Mbit/s to 1 Tbit/s, 40 per decade.
SCAN_BPS = np.logspace(6, 12, 241)


def rate_text(bps: float) -> str:
    """A rate in --network form, e.g. 370mbit."""
    for unit, size in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= size:
            return f"{bps / size:.4g}{unit}"
    return f"{bps:.4g}bit"


def crossings(gap, rates: Sequence[float]) -> list[float]:
    """Every rate where gap(rate) changes sign between neighbours of `rates`, refined by Brent's method in
    log-rate; fastest first."""
    values = [gap(r) for r in rates]
    found = []
    for i in range(len(rates) - 1, 0, -1):
        a, b = values[i - 1], values[i]
        if math.isfinite(a) and math.isfinite(b) and (a > 0) != (b > 0):
            root = brentq(lambda x: gap(math.exp(x)), math.log(rates[i - 1]), math.log(rates[i]), xtol=1e-6)
            found.append(math.exp(root))
    return found


def crossover_table(suite: CalibratedSuite, world_sizes: Sequence[int], settings: Settings,
                    baseline: str | None) -> pd.DataFrame:
    """Per configuration (but the baseline) and world size: the rates (bit/s, fastest first, ';'-joined) where its
    projected throughput crosses the baseline's and where its projected time to target does, and whether it beats
    the baseline at the slowest and the fastest scanned rate. Each configuration is set against its own workload's
    baseline (tables.workload_bases); a workload with none has no rows."""
    bases = workload_bases(suite, baseline)
    known: dict[tuple[int, int, str], float] = {}  # (calibration, world size, rate): every scan asks the same rates

    def step_of(calibration: Calibration, world_size: int, bps: float) -> float:
        key = (id(calibration), world_size, rate_text(bps))
        if key not in known:
            known[key] = project_one(calibration, world_size, key[2], settings).parts.step_s
        return known[key]

    compared = [c for c in suite.calibrations if bases.get(c.workload) is not None and bases[c.workload] is not c]
    pairs = [(c, n) for c in compared for n in world_sizes]
    rows = []
    for c, n in phase(pairs, "crossovers (configuration x world size)", "pair"):
        base = bases[c.workload]
        pair = {"workload": c.workload, "label": c.model.label, "baseline": base.model.label, "world_size": n}
        if not math.isfinite(step_of(c, n, SCAN_BPS[0]) + step_of(base, n, SCAN_BPS[0])):
            rows.append({**pair, "throughput_crossover": "not projected", "time_to_target_crossover": "not projected",
                         "faster_at_slowest": None, "faster_at_fastest": None})
            continue
        per_sample = lambda bps, c=c, n=n, base=base: (step_of(base, n, bps) / base.model.batch_size  # noqa: E731
                                                       - step_of(c, n, bps) / c.model.batch_size)
        rates = crossings(per_sample, SCAN_BPS)
        target = []
        if c.steps_to_target is not None and base.steps_to_target is not None:
            to_target = lambda bps, c=c, n=n, base=base: (base.steps_to_target * step_of(base, n, bps)  # noqa: E731
                                                          - c.steps_to_target * step_of(c, n, bps))
            target = crossings(to_target, SCAN_BPS)
        rows.append({**pair, "throughput_crossover": "; ".join(rate_text(r) for r in rates) or "none",
                     "time_to_target_crossover": ("; ".join(rate_text(r) for r in target) or "none")
                     if c.steps_to_target is not None else "never reaches the target",
                     "faster_at_slowest": per_sample(SCAN_BPS[0]) > 0,
                     "faster_at_fastest": per_sample(SCAN_BPS[-1]) > 0})
    return pd.DataFrame(rows)
