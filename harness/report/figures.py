"""Figures of the report: the figure factory, accuracy curves, time to target and bytes per sample."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from harness.report import stats

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(width: float = 7.5, height: float = 4.5) -> Figure:
    """A new figure with no pyplot state, rendered with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")

def note(ax: Any, text: str) -> None:
    """Write a centred message on an axes that has nothing else to show."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=11)

def label_ticks(ax: Any, labels: Sequence[str]) -> None:
    """Slant category tick labels when they would collide."""
    if len(labels) > 3 or max((len(label) for label in labels), default=0) > 14:
        ax.tick_params(axis="x", labelrotation=25)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")

def png_bytes(fig: Figure) -> bytes:
    """Render a figure to PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()

def plot_accuracy(curve_table: pd.DataFrame, x_label: str, target: float | None = None) -> Figure:
    """curves (rows x CURVE_COLUMNS) -> a line per label: mean test accuracy over seeds with 95% CI bands.

    The bands are seaborn's errorbar=("ci", 95), computed by bootstrap_ci95 (the same bootstrap, vectorized).
    """
    import seaborn as sns

    fig = new_figure()
    ax = fig.subplots()
    data = curve_table.dropna(subset=["test_accuracy"])
    if data.empty:
        note(ax, "no evaluation records to plot")
    else:
        data = data.astype({"x": float, "test_accuracy": float})
        sns.lineplot(data=data, x="x", y="test_accuracy", hue="label", errorbar=stats.bootstrap_ci95, ax=ax)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.legend(title=None, fontsize="small")
    ax.set_xlabel(x_label)
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Test accuracy vs {x_label.split(' (')[0]} (mean over seeds, 95% CI)")
    return fig

def plot_time_to_target(table: pd.DataFrame, target: float | None = None) -> Figure:
    """summary (runs x columns) -> a bar per label: mean time to target over the runs that reached it, 95% CI.

    Tick labels say how many of each label's runs reached the target; labels that never did keep an empty slot
    and are named in the title. With no run reaching the target the figure says so in words.
    """
    import seaborn as sns

    fig = new_figure()
    ax = fig.subplots()
    target_text = f"target accuracy {target:g}" if target is not None else "target accuracy"
    labels = [str(label) for label in pd.unique(table["label"])]
    reached = table[np.isfinite(table["time_to_target_s"].astype(float))]
    if reached.empty:
        note(ax, f"No run reached the {target_text}" if labels else "No runs")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        data = reached.astype({"time_to_target_s": float, "label": str})
        sns.barplot(data=data, x="label", y="time_to_target_s", order=labels, errorbar=("ci", 95), seed=0,
                    ax=ax)
        counts = [f"{label}\n({(data['label'] == label).sum()}/{(table['label'] == label).sum()} reached)"
                  for label in labels]
        ax.set_xticks(range(len(labels)), counts)
        label_ticks(ax, labels)
    ax.set_xlabel("")
    ax.set_ylabel("train time to target (s)")
    never = [label for label in labels if label not in set(reached["label"].astype(str))]
    title = f"Train time to reach the {target_text} (mean, 95% CI)"
    if never and not reached.empty:
        title += "\nnever reached by: " + ", ".join(never)
    ax.set_title(title)
    return fig

def _human_bytes(value: float) -> str:
    """1234567 -> '1.23 MB' (decimal units)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.3g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")

def plot_bytes_per_sample(table: pd.DataFrame) -> Figure:
    """summary (runs x columns) -> a bar per label: bytes sent (all ranks) per training sample, mean, 95% CI.

    The y axis is logarithmic when the labels' positive means span more than 100x. Each bar carries its mean.
    """
    import seaborn as sns

    fig = new_figure()
    ax = fig.subplots()
    labels = [str(label) for label in pd.unique(table["label"])]
    data = table[np.isfinite(table["bytes_per_sample"].astype(float))]
    data = data.astype({"bytes_per_sample": float, "label": str})
    if data.empty:
        note(ax, "No run recorded bytes and samples")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        sns.barplot(data=data, x="label", y="bytes_per_sample", order=labels, errorbar=("ci", 95), seed=0,
                    ax=ax)
        means = data.groupby("label")["bytes_per_sample"].mean()
        positive = means[means > 0]
        if len(positive) and positive.max() / positive.min() > 100:
            ax.set_yscale("log")
        for position, label in enumerate(labels):
            if label in means and means[label] > 0:
                ax.annotate(_human_bytes(means[label]), (position, means[label]), xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom", fontsize="small")
            elif label in means:
                ax.text(position, 0.02, "0 B", ha="center", transform=ax.get_xaxis_transform(),
                        fontsize="small")
        label_ticks(ax, labels)
    ax.set_xlabel("")
    ax.set_ylabel("bytes sent per sample (all ranks)" + (", log scale" if ax.get_yscale() == "log" else ""))
    ax.set_title("Communication per training sample (mean over seeds, 95% CI)")
    return fig
