"""Throughput and memory in the report: samples per second per label, each rank's peak resident memory, and the
emulated device memory (planned against measured bytes, and the runs a memory_per_rank refused)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from harness.bytesize import format_bytes
from harness.report import stats
from harness.report.figures import bar_panels, in_panel, label_bars, new_figure, note, panel_keys, panel_title
from harness.report.styles import Style
from harness.report.tables import numeric, state_text
from harness.results import RunResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_throughput(table: pd.DataFrame, styles: dict[str, Style] | None = None,
                    interval: str = stats.CI_WORDS, per_token: set[str] | frozenset[str] = frozenset()) -> Figure:
    """summary (runs x columns) -> per workload, a horizontal bar per label: training samples per second of train
    time (samples_per_s: every rank's samples together), or tokens per second (tokens_per_s) on the workloads in
    `per_token` (language models), mean over seeds with its 95% bootstrap interval, the value written beyond it."""
    unit = "samples or tokens" if per_token else "samples"
    title = f"Training throughput ({unit} per second of train time, mean over seeds, {interval})"
    tokens = table["workload"].astype(str).isin(per_token)
    rates = table.assign(throughput=np.where(tokens, table.get("tokens_per_s", np.nan), table["samples_per_s"]))
    fig, panels = bar_panels(rates, "throughput", styles, log=False)  # bar lengths compare as throughputs do
    for ax, key, labels, data in panels:
        if data.empty:
            note(ax, "No run recorded samples and train time", bare=True)
        else:
            label_bars(ax, labels, data, "throughput", lambda mean: f"{mean:,.0f}")
        counted = in_panel(rates, key)["workload"].astype(str).isin(per_token) if key is not None else tokens
        what = "tokens / s" if len(counted) and counted.all() else "samples / s"
        ax.set_xlabel(what + (", log scale" if ax.get_xscale() == "log" else ""))
        panel_title(ax, key, len(panels) > 1, title)
    if len(panels) > 1:
        fig.suptitle(title)
    return fig


def rank_memory(runs: Sequence[RunResult]) -> pd.DataFrame:
    """runs -> one row per (run, rank) with the rank's peak resident memory, from its `cpu` record's
    peak_rss_bytes (runs written before the field have none). Columns: run_id, label, workload, seed, rank,
    peak_rss_bytes."""
    rows = []
    for run in runs:
        cpu = run.metrics[run.metrics["kind"] == "cpu"]
        peaks, ranks = numeric(cpu, "peak_rss_bytes"), numeric(cpu, "rank")
        for rank, peak in zip(ranks, peaks, strict=True):
            if math.isfinite(rank) and math.isfinite(peak):
                rows.append({"run_id": run.spec.get("run_id") or run.run_dir.name, "label": run.label,
                             "workload": str(run.spec.get("workload")),
                             "seed": run.spec.get("seed"), "rank": int(rank), "peak_rss_bytes": float(peak)})
    return pd.DataFrame(rows, columns=["run_id", "label", "workload", "seed", "rank", "peak_rss_bytes"])


def plot_peak_memory(memory: pd.DataFrame, interval: str = stats.CI_WORDS) -> Figure:
    """rank_memory rows -> per workload, a group of bars per label, one bar per rank: its peak resident memory
    (MB, mean over seeds, 95% CI). A rank's RSS counts the Python interpreter, torch and the data, not only the
    model: the differences between ranks and labels are what the plot is for."""
    import seaborn as sns

    keys = panel_keys(memory)
    counts = [max(1, in_panel(memory, key)["label"].nunique()) for key in keys]
    fig = new_figure(9.5, 1.4 + sum(0.28 * c * max(1, memory["rank"].nunique() if len(memory) else 1) + 0.6
                                    for c in counts))
    axes = np.atleast_1d(fig.subplots(len(keys), 1, squeeze=False, height_ratios=counts).ravel())
    for ax, key in zip(axes, keys, strict=True):
        rows = in_panel(memory, key)
        if rows.empty:
            note(ax, "No run recorded its ranks' peak memory", bare=True)
            continue
        data = rows.assign(peak_mb=rows["peak_rss_bytes"] / 1e6, rank=rows["rank"].map(lambda r: f"rank {r}"))
        ranks = sorted(data["rank"].unique(), key=lambda text: int(text.split()[1]))
        sns.barplot(data=data.astype({"label": str}), y="label", x="peak_mb", hue="rank", hue_order=ranks,
                    palette="crest", errorbar=stats.bootstrap_ci95, ax=ax)
        ax.set_xlabel("peak resident memory (MB)")
        ax.set_ylabel("")
        ax.legend(title=None, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        if len(keys) > 1:
            ax.set_title(key, loc="left", fontsize="medium")
    fig.suptitle(f"Peak resident memory of each rank (mean over seeds, {interval})")
    return fig


def memory_html(table: pd.DataFrame) -> str:
    """summary -> the 'Emulated device memory' section: per workload and label, the memory_per_rank, the largest
    rank's plan, the allocator's peak over the measured steps and their ratio (the plan's error against the ground
    truth), the held bytes by kind as the breakdown (means over seeds; a plan does not depend on the seed), and what
    became of the runs: 'fits', or 'does not fit (needs X > Y)'. Empty when no run recorded a plan."""
    rows = table[numeric(table, "planned_memory_bytes").notna()]
    if rows.empty:
        return ""
    e = html.escape

    def mean_bytes(values: pd.Series) -> str:
        return format_bytes(float(values.mean())) if values.notna().any() else "–"

    body = []
    for (workload, label), group in rows.groupby(["workload", "label"], sort=False):
        planned = float(numeric(group, "planned_memory_bytes").mean())
        held = numeric(group, "held_memory_bytes")
        peak = numeric(group, "allocator_peak_bytes") if "allocator_peak_bytes" in group else pd.Series(math.nan)
        budget = float(numeric(group, "memory_per_rank").max())
        refused = group[group["state"] == "does_not_fit"]
        verdict = (state_text("does_not_fit", planned, budget) if len(refused) == len(group) else
                   f"{len(group) - len(refused)} of {len(group)} fit" if len(refused) else
                   "fits" if math.isfinite(budget) else "no budget")
        ratio = planned / float(peak.mean()) if peak.notna().any() and peak.mean() > 0 else math.nan
        body.append(f"<tr><td>{e(str(workload))}</td><td>{e(str(label))}</td>"
                    f"<td>{format_bytes(budget) if math.isfinite(budget) else '–'}</td>"
                    f"<td>{format_bytes(planned)}</td><td>{mean_bytes(peak)}</td>"
                    f"<td>{f'{ratio:.3f}' if math.isfinite(ratio) else '–'}</td><td>{mean_bytes(held)}</td>"
                    f"<td>{e(verdict)}</td></tr>")
    return ("<h2>Emulated device memory</h2>\n<p>Each method plans, before its first step, the bytes every rank will "
            "hold: weights, gradients, optimizer state, the weight versions it keeps, the activations its schedule "
            "holds at its peak, its temporaries, and communication and compression buffers (docs/memory.md). A run "
            "whose largest rank's plan exceeds its memory_per_rank stops before training. <i>Allocator peak</i> is "
            "the ground truth the plan is judged against: the most bytes the allocator had handed out to the method "
            "over steps 2-4, on the largest rank. <i>Held</i> is the plan's kinds measured while training (each at "
            "its peak), the breakdown.</p>\n<table>\n<tr><th>workload</th><th>label</th><th>memory_per_rank</th>"
            "<th>planned</th><th>allocator peak</th><th>planned / peak</th><th>held (by kind)</th><th>runs</th>"
            "</tr>\n" + "\n".join(body) + "\n</table>")
