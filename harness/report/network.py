"""The network part of the report: throughput and time to target against the link rate, and the crossovers."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from harness.net.spec import parse_network
from harness.report.figures import new_figure, note
from harness.report.page import table_html

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def network_order(networks: Sequence[str]) -> list[str]:
    """Distinct networks (--network form) from the slowest to the fastest: by rate, then larger latency first;
    'unlimited' after every rate and '' (no emulation, loopback) last."""
    def key(text: str) -> tuple[float, float]:
        if not text:
            return (math.inf, -1.0)
        spec = parse_network(text)
        return (float(spec.rate_bps) if spec.rate_bps else 1e30, -spec.latency_s)

    return sorted(set(networks), key=key)

def method_label(label: str, network: str) -> str:
    """A run's label without the ' @ <network>' that the suite expansion appends: what it is across networks."""
    suffix = f" @ {network}"
    return label[: -len(suffix)] if network and label.endswith(suffix) else label

def network_speedup(table: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """summary (runs x columns) -> DataFrame (method labels · networks x columns), networks slowest first.

    Columns: method_label (the label without its network), network, runs, samples_per_s and time_to_target_s (means
    over the seeds; time only over the runs that reached the target), throughput_speedup (samples_per_s over that of
    the `baseline` label, a label without its network, at the same network) and time_speedup (the baseline's time to
    target over this one's): above 1 where the method beats the baseline. The speed-ups are NaN where the baseline has
    no value.
    """
    networks = table["network"].fillna("").astype(str)
    data = table.assign(network=networks, method_label=[
        method_label(str(label), network) for label, network in zip(table["label"], networks, strict=True)])
    rows = []
    for (label, network), group in data.groupby(["method_label", "network"], sort=False):
        rows.append({"method_label": label, "network": network, "runs": len(group),
                     "samples_per_s": group["samples_per_s"].astype(float).mean(),
                     "time_to_target_s": group["time_to_target_s"].astype(float).mean()})
    frame = pd.DataFrame(rows, columns=["method_label", "network", "runs", "samples_per_s", "time_to_target_s"])
    by_network = frame[frame["method_label"] == baseline].set_index("network")
    frame["throughput_speedup"] = [row.samples_per_s / by_network["samples_per_s"].get(row.network, math.nan)
                                   for row in frame.itertuples()]
    frame["time_speedup"] = [by_network["time_to_target_s"].get(row.network, math.nan) / row.time_to_target_s
                             for row in frame.itertuples()]
    order = {network: i for i, network in enumerate(network_order(frame["network"]))}
    labels = {label: i for i, label in enumerate(pd.unique(frame["method_label"]))}
    frame = frame.sort_values(by=["method_label", "network"], key=lambda column: column.map(
        labels if column.name == "method_label" else order), kind="stable")
    return frame.reset_index(drop=True)

def plot_network_crossover(speedups: pd.DataFrame, baseline: str) -> Figure:
    """network_speedup (method labels · networks x columns) -> three panels against the link rate (slowest left):
    throughput (samples/s of train time), train time to the target, and throughput over the baseline's (where a
    method's line crosses 1 is the crossover: compression pays at the rates left of it)."""
    fig = new_figure(15, 4.6)
    axes = fig.subplots(1, 3)
    networks = network_order(speedups["network"])
    position = {network: i for i, network in enumerate(networks)}
    panels = (("samples_per_s", "samples / s of train time", "Throughput"),
              ("time_to_target_s", "train time to target (s)", "Time to target"),
              ("throughput_speedup", f"throughput / {baseline}'s", f"Throughput over {baseline}'s"))
    for ax, (column, ylabel, title) in zip(axes, panels, strict=True):
        for label, group in speedups.groupby("method_label", sort=False):
            xs = [position[network] for network in group["network"]]
            ax.plot(xs, group[column].astype(float), marker="o", label=str(label))
        if column == "throughput_speedup":
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        if column == "time_to_target_s":
            reached = speedups.groupby("method_label", sort=False)[column].apply(
                lambda times: bool(np.isfinite(times.astype(float)).any()))
            if not reached.any():
                note(ax, "no run reached the target")
            elif not reached.all():
                ax.text(0.02, 0.02, "never reached: " + ", ".join(map(str, reached.index[~reached])),
                        transform=ax.transAxes, fontsize="small", va="bottom")
        ax.set_xticks(range(len(networks)), [network or "loopback" for network in networks])
        ax.set_xlabel("link rate per rank and direction (slowest left)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} (mean over seeds)")
        if column != "throughput_speedup" and (speedups[column].astype(float) > 0).any():
            ax.set_yscale("log")
    axes[0].legend(title=None, fontsize="small")
    return fig

def crossover_rate(rates_bps: Sequence[float], baseline_times: Sequence[float],
                   method_times: Sequence[float]) -> float:
    """Where a method's time (per sample, or to the target) meets the baseline's, in bit/s; NaN where none is seen.

    rates_bps: the shaped rates, slowest first (rates x 1), each with both times measured. Between two adjacent rates
    where the sign of baseline - method changes, both times are taken as linear in 1/rate (a fixed compute part plus
    bytes / rate) and the two lines are intersected. The slowest such change is returned.
    """
    x = 1 / np.asarray(rates_bps, dtype=float)
    gap = np.asarray(baseline_times, dtype=float) - np.asarray(method_times, dtype=float)
    for i in range(len(x) - 1):
        if np.isfinite(gap[i]) and np.isfinite(gap[i + 1]) and (gap[i] > 0) != (gap[i + 1] > 0):
            return float(1 / (x[i] - gap[i] * (x[i + 1] - x[i]) / (gap[i + 1] - gap[i])))
    return math.nan

def crossover_lines(speedups: pd.DataFrame, column: str = "throughput_speedup") -> list[str]:
    """network_speedup -> one sentence per method label that has a baseline to compare with: at which networks
    (slowest first) it beats the baseline (`column` above 1) and at which it does not, and where its time per sample
    and its time to target cross the baseline's (crossover_rate over the shaped rates without latency)."""
    lines = []
    for label, group in speedups.groupby("method_label", sort=False):
        values = group.set_index("network")[column].astype(float)
        if not np.isfinite(values).any() or np.allclose(values[np.isfinite(values)], 1.0):
            continue
        wins = [n or "loopback" for n, v in values.items() if np.isfinite(v) and v > 1]
        losses = [n or "loopback" for n, v in values.items() if np.isfinite(v) and v <= 1]
        line = f"{label}: faster at {', '.join(wins) if wins else 'no rate'}" + (
            f"; not at {', '.join(losses)}" if losses else "")
        shaped = group[[bool(n) and parse_network(n).rate_bps is not None and not parse_network(n).latency
                        for n in group["network"]]]
        rates = [parse_network(n).rate_bps for n in shaped["network"]]
        per_sample = crossover_rate(rates, 1 / (shaped["samples_per_s"] / shaped["throughput_speedup"]),
                                    1 / shaped["samples_per_s"])
        to_target = crossover_rate(rates, shaped["time_to_target_s"] * shaped["time_speedup"],
                                   shaped["time_to_target_s"])
        found = [f"{what} at about {rate / 1e6:.0f} Mbit/s" for what, rate in
                 (("throughput", per_sample), ("time to target", to_target)) if np.isfinite(rate)]
        if found:
            line += "; crossover (interpolated in 1/rate): " + ", ".join(found)
        lines.append(line)
    return lines

def network_html(speedups: pd.DataFrame, baseline: str) -> str:
    """The 'By network' section: where each method beats the baseline, and the per-network table."""
    e = html.escape
    items = "\n".join(f"<li>{e(line)}</li>" for line in crossover_lines(speedups))
    shown = speedups.rename(columns={
        "method_label": "method", "samples_per_s": "samples / s", "time_to_target_s": "time to target (s)",
        "throughput_speedup": f"throughput / {baseline}", "time_speedup": f"{baseline} time to target / this"})
    return f"""<h2>By network</h2>
<p>The same runs on emulated networks (each rank's link limited to the given rate in each direction). Above 1, a
method beats {e(baseline)} at that rate; where its speed-up crosses 1 is where compression starts to pay.</p>
<p>Throughput (samples per second of train time) against {e(baseline)}'s:</p>
<ul>
{items}
</ul>
{table_html(shown)}
"""
