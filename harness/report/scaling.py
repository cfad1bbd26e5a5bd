"""Scaling in the report: time to target and final accuracy against world size, when a suite varies it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from harness.report import stats
from harness.report.figures import legend_outside, new_figure
from harness.report.styles import Style

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: What the plot draws against world size: (summary column, axis label).
MEASURES = (("time_to_target_s", "train time to target (s)"), ("final_accuracy", "final test accuracy"))


#: The narrowest accuracy axis the plot draws: a spread of a few tenths of a point does not fill the panel.
ACCURACY_SPAN = 0.05


def _at_least(ax, span: float) -> None:
    """Widen the y-axis around its data to at least `span`, shifted to stay within [0, 1]."""
    low, high = ax.get_ylim()
    if high - low >= span:
        return
    middle = (low + high) / 2
    low, high = middle - span / 2, middle + span / 2
    shift = max(0.0, -low) - max(0.0, high - 1.0)
    ax.set_ylim(low + shift, high + shift)


def scaling_rows(table: pd.DataFrame) -> pd.DataFrame:
    """summary (runs x columns) -> the runs of the (method, workload, network) that ran at more than one world size
    (empty when the suite varies no world size). A suite over several networks draws each network's runs as a
    line of its own (plot_scaling groups by method and network)."""
    keys = ["method", "workload", table["network"].fillna("").astype(str).rename("net")]
    sizes = table.groupby(keys)["world_size"].transform("nunique")
    return table[sizes > 1]


def plot_scaling(rows: pd.DataFrame, styles: dict[str, Style] | None = None,
                 interval: str = stats.CI_WORDS) -> Figure:
    """scaling_rows -> a column per workload, a row per MEASURES: a line per method through its world sizes (the
    mean over the runs at each size, with the 95% bootstrap interval as error bars). Time to target averages the
    runs that reached it. A method's colour is that of its first label."""
    workloads = [str(w) for w in pd.unique(rows["workload"])]
    fig = new_figure(4.6 * len(workloads) + 2.4, 6.4)
    axes = fig.subplots(len(MEASURES), len(workloads), squeeze=False)
    for column, workload in enumerate(workloads):
        mine = rows[rows["workload"].astype(str) == workload]
        for row, (measure, name) in enumerate(MEASURES):
            ax = axes[row][column]
            nets = mine["network"].fillna("").astype(str)
            for (method, net), group in mine.groupby(["method", nets.rename("net")], sort=False):
                first = str(group["label"].iloc[0])
                color = styles[first].color if styles and first in styles else None
                sizes, means, errors = [], [], [[], []]
                for size, at in group.groupby("world_size"):
                    values = pd.to_numeric(at[measure], errors="coerce").to_numpy(dtype=float)
                    values = values[np.isfinite(values)]
                    if not len(values):
                        continue
                    low, high = stats.bootstrap_ci95(values)
                    mean = float(values.mean())
                    sizes.append(int(size))
                    means.append(mean)
                    errors[0].append(0.0 if np.isnan(low) else mean - low)
                    errors[1].append(0.0 if np.isnan(high) else high - mean)
                if sizes:
                    line = f"{method} @ {net}" if net else str(method)
                    ax.errorbar(sizes, means, yerr=errors, marker="o", capsize=3, label=line, color=color)
            ax.set_xticks(sorted({int(s) for s in mine["world_size"]}))
            ax.set_xlabel("world size (ranks)")
            ax.set_ylabel(name)
            if measure == "final_accuracy":
                _at_least(ax, ACCURACY_SPAN)
            if row == 0:
                ax.set_title(workload, fontsize="medium")
    legend_outside(fig, list(axes.ravel()))
    fig.suptitle(f"Against world size (mean over seeds, {interval})")
    return fig


def scaling_caption(rows: pd.DataFrame) -> str:
    """Which labels each line joins (their other params may differ too)."""
    parts = [f"{method} on {workload}: " + ", ".join(str(label) for label in pd.unique(group["label"]))
             for (method, workload), group in rows.groupby(["method", "workload"], sort=False)]
    return "Each line joins the labels of one method and workload at the world sizes the suite ran: " + "; ".join(
        parts) + ". Their other params may differ."
