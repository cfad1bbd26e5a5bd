"""Measurement hygiene: whether a run's ranks were starved of CPU by other processes (a `noisy` run), from its
`cpu` records (harness/run/usage.py)."""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

#: A rank is starved when it ran less than this share of the time it was runnable: cpu / (cpu + run-queue wait),
#: or, where the kernel gives no run-queue wait, cpu / (wall · threads).
STARVED_SHARE = 0.8
#: A run is noisy when a rank was starved while the rest of the machine (every other process, and time the
#: hypervisor stole) used at least this share of its cores over the run. Without it, a run whose own threads
#: compete (an all-reduce thread beside the backward) would count as noisy on a quiet machine.
OTHER_LOAD = 0.1
#: Summary columns whose values are measured times: a claim on them is judged only on runs that are not noisy.
TIME_COLUMNS = ("time_to_target_s", "train_time_s", "samples_per_s")


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def cpu_share(record: pd.Series) -> float:
    """One `cpu` record -> the share of its runnable time the rank ran: cpu_s / (cpu_s + wait_s), or
    cpu_s / (wall_s · threads) without wait_s; NaN when it has neither."""
    cpu, wait, wall = _number(record.get("cpu_s")), _number(record.get("wait_s")), _number(record.get("wall_s"))
    if not cpu >= 0:  # NaN, or a negative CPU time: no reading (a corrupt record), not a starved rank
        return math.nan
    if math.isfinite(wait) and cpu + wait > 0:
        return cpu / (cpu + wait)
    threads = _number(record.get("threads"))
    if wall > 0 and threads > 0:
        return cpu / (wall * threads)
    return math.nan


def other_load(records: pd.DataFrame) -> float:
    """`cpu` records of one run (rows: ranks) -> the largest share of a host's cores used by anything but the run's
    ranks on it: (machine_busy_s + machine_steal_s - sum of its ranks' cpu_s) / (cores · wall_s), with the machine
    readings of the host's lowest rank. NaN when the records lack them."""
    hosts = records["host"].fillna("") if "host" in records.columns else pd.Series("", index=records.index)
    worst = math.nan
    for _, ranks in records.groupby(hosts, sort=False):
        first = ranks.sort_values("rank").iloc[0]
        busy, steal = _number(first.get("machine_busy_s")), _number(first.get("machine_steal_s"))
        cores, wall = _number(first.get("cores")), _number(first.get("wall_s"))
        if not (math.isfinite(busy) and cores > 0 and wall > 0):
            continue
        own = pd.to_numeric(ranks["cpu_s"], errors="coerce").sum()
        share = (busy + (steal if math.isfinite(steal) else 0.0) - own) / (cores * wall)
        worst = share if math.isnan(worst) else max(worst, share)
    return worst


def run_hygiene(metrics: pd.DataFrame) -> dict[str, Any]:
    """A run's metrics (records x fields) -> {cpu_share, other_load, noisy}.

    cpu_share: the lowest over ranks (cpu_share of each `cpu` record); other_load: see other_load; noisy: a rank's
    cpu_share < STARVED_SHARE while other_load >= OTHER_LOAD (or other_load is unknown). NaN / None (unknown) for a
    run without `cpu` records (older runs, or a run that died).
    """
    records = metrics[metrics["kind"] == "cpu"] if "kind" in metrics.columns else metrics.iloc[0:0]
    if records.empty:
        return {"cpu_share": math.nan, "other_load": math.nan, "noisy": None}
    shares = [value for value in (cpu_share(row) for _, row in records.iterrows()) if math.isfinite(value)]
    share = min(shares) if shares else math.nan
    other = other_load(records)
    if math.isnan(share):
        return {"cpu_share": share, "other_load": other, "noisy": None}
    starved = share < STARVED_SHARE
    busy = math.isnan(other) or other >= OTHER_LOAD
    return {"cpu_share": share, "other_load": other, "noisy": bool(starved and busy)}


def noisy_runs(table: pd.DataFrame) -> pd.DataFrame:
    """summary (runs x columns) -> the rows whose `noisy` is true."""
    if "noisy" not in table.columns:
        return table.iloc[0:0]
    return table[table["noisy"].astype("boolean").fillna(False).astype(bool)]


def noisy_warning(table: pd.DataFrame) -> str:
    """One line saying which runs were starved of CPU by other processes, by label and seed (a workload's name
    before its labels where the table has several), or '' when none was."""
    noisy = noisy_runs(table)
    if noisy.empty:
        return ""
    return (f"{len(noisy)} of {len(table)} runs were starved of CPU by other processes (a rank ran less than "
            f"{STARVED_SHARE:g} of the time it was runnable while others used at least {OTHER_LOAD:.0%} of the "
            f"machine): their times are not to be trusted; rerun them on a quiet machine. Noisy: "
            f"{_by_label(noisy, several_workloads=table['workload'].nunique() > 1)}")


def _by_label(runs: pd.DataFrame, several_workloads: bool) -> str:
    """'ddp x2 (seeds 0, 1), qsgd x2 (seed 1)', in the table's order; 'digits-mlp: ddp x2 (seed 0)' with
    several workloads."""
    parts = []
    for (workload, label), group in runs.groupby(["workload", "label"], sort=False, dropna=False):
        seeds = sorted(int(s) for s in group["seed"].dropna())
        which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
        parts.append(f"{workload}: {label} ({which})" if several_workloads else f"{label} ({which})")
    return ", ".join(parts)


def noisy_html(table: pd.DataFrame) -> str:
    """The warning of noisy_warning as an HTML paragraph, or ''."""
    text = noisy_warning(table)
    return f'<p class="warning"><b>Noisy measurements.</b> {html.escape(text)}</p>\n' if text else ""
