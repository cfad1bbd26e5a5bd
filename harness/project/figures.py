"""Figures of a projection: throughput and speed-up against world size per network, and projected against
measured step times."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from harness.report.figures import new_figure, note

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_projection(table: pd.DataFrame, baseline: str | None) -> Figure:
    """projection rows -> two rows of panels, one column per network: projected samples per second against world
    size (log-log), and the speed-up over the baseline's (1 dashed: above it the method pays)."""
    networks = list(dict.fromkeys(table["network"]))
    fig = new_figure(4.2 * max(1, len(networks)), 7.5)
    axes = np.atleast_2d(fig.subplots(2, max(1, len(networks)), squeeze=False))
    for column, network in enumerate(networks):
        data = table[table["network"] == network]
        top, bottom = axes[0][column], axes[1][column]
        several = data["workload"].nunique() > 1  # then a line names its workload too
        for (workload, label), group in data.groupby(["workload", "label"], sort=False):
            name = f"{label} ({workload})" if several else str(label)
            group = group.sort_values("world_size")
            top.plot(group["world_size"], group["samples_per_s"], marker="o", label=name)
            bottom.plot(group["world_size"], group["speedup"], marker="o", label=name)
        top.set_title(f"{network or 'loopback'}: projected throughput")
        top.set_ylabel("samples / s")
        bottom.set_title(f"{network or 'loopback'}: over {baseline}" if baseline else network)
        bottom.set_ylabel(f"throughput / {baseline}'s" if baseline else "speed-up")
        bottom.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("world size (ranks)")
        if data["samples_per_s"].astype(float).gt(0).any():
            top.set_yscale("log")
        else:
            note(top, "nothing projected")
    axes[0][0].legend(fontsize="small")
    return fig


def plot_validation(validation: pd.DataFrame) -> Figure:
    """validation rows -> projected against measured step time per held-out configuration (log-log), with y = x
    and the ±10% and ±25% bands."""
    fig = new_figure(6.5, 6.0)
    ax = fig.subplots()
    data = validation.dropna(subset=["measured_step_s", "projected_step_s"]) if len(validation) else validation
    if data.empty:
        note(ax, "no held-out configuration to compare")
        return fig
    low = float(min(data["measured_step_s"].min(), data["projected_step_s"].min())) * 0.8
    high = float(max(data["measured_step_s"].max(), data["projected_step_s"].max())) * 1.25
    line = np.array([low, high])
    ax.plot(line, line, color="black", linewidth=1, label="projected = measured")
    for band, style in ((0.10, "--"), (0.25, ":")):
        ax.plot(line, line * (1 + band), color="grey", linestyle=style, linewidth=1, label=f"±{band:.0%}")
        ax.plot(line, line * (1 - band), color="grey", linestyle=style, linewidth=1)
    for network, group in data.groupby("network", sort=False):
        ax.scatter(group["measured_step_s"], group["projected_step_s"], label=str(network), s=28)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("projected step time (s)")
    ax.set_title("Projection of held-out runs")
    ax.legend(fontsize="small")
    return fig
