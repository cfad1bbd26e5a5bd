"""Figures of the report: the figure factory, accuracy curves, time to target, bytes per sample, probability of
improvement and performance profiles. Colours follow the method family (report/styles.py)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from harness.report import stats
from harness.report.styles import Style, label_styles

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

def styles_for(labels: Sequence[str], styles: dict[str, Style] | None) -> dict[str, Style]:
    """`styles` for `labels`, or (None, or a label missing) styles by label alone, as one family."""
    if styles is not None and all(label in styles for label in labels):
        return styles
    return label_styles(pd.DataFrame({"label": list(labels), "family": "?"}))

def bar_height(count: int) -> float:
    """Figure height (inches) for `count` horizontal bars, so that their labels never overlap."""
    return max(3.0, 1.6 + 0.38 * count)

def plot_accuracy(curve_table: pd.DataFrame, x_label: str, target: float | None = None,
                  styles: dict[str, Style] | None = None) -> Figure:
    """curves (rows x CURVE_COLUMNS) -> a line per label: mean test accuracy over seeds with 95% CI bands.

    The bands are stats.bootstrap_ci95 (the percentile bootstrap of the mean, as seaborn's errorbar=("ci", 95)).
    Colour by family, dash pattern within it (`styles`, from label_styles of the summary).
    """
    import seaborn as sns

    fig = new_figure()
    ax = fig.subplots()
    data = curve_table.dropna(subset=["test_accuracy"])
    if data.empty:
        note(ax, "no evaluation records to plot")
    else:
        data = data.astype({"x": float, "test_accuracy": float, "label": str})
        labels = list(pd.unique(data["label"]))
        chosen = styles_for(labels, styles)
        sns.lineplot(data=data, x="x", y="test_accuracy", hue="label", style="label", hue_order=labels,
                     style_order=labels, palette={k: chosen[k].color for k in labels},
                     dashes={k: chosen[k].dashes or "" for k in labels}, errorbar=stats.bootstrap_ci95, ax=ax)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.legend(title=None, fontsize="small")
    ax.set_xlabel(x_label)
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Test accuracy vs {x_label.split(' (')[0]} (mean over seeds, 95% CI)")
    return fig

def _bars(table: pd.DataFrame, value: str, labels: list[str], styles: dict[str, Style] | None) -> tuple:
    """A horizontal bar per label (mean of `value`, 95% bootstrap interval), on a figure tall enough for them."""
    import seaborn as sns

    fig = new_figure(9.0, bar_height(len(labels)))
    ax = fig.subplots()
    chosen = styles_for(labels, styles)
    data = table[np.isfinite(table[value].astype(float))].astype({value: float, "label": str})
    if not data.empty:
        sns.barplot(data=data, y="label", x=value, order=labels, hue="label", hue_order=labels, legend=False,
                    palette={k: chosen[k].color for k in labels}, errorbar=stats.bootstrap_ci95, ax=ax)
    return fig, ax, data

def plot_time_to_target(table: pd.DataFrame, target: float | None = None,
                        styles: dict[str, Style] | None = None) -> Figure:
    """summary (runs x columns) -> a horizontal bar per label: mean time to target over the runs that reached it,
    95% bootstrap CI.

    Tick labels (one per row, so they never overlap) say how many of each label's runs reached the target; labels
    that never did keep an empty row and are named in the title. With no run reaching it the figure says so.
    """
    target_text = f"target accuracy {target:g}" if target is not None else "target accuracy"
    labels = [str(label) for label in pd.unique(table["label"])]
    fig, ax, reached = _bars(table, "time_to_target_s", labels, styles)
    if reached.empty:
        note(ax, f"No run reached the {target_text}" if labels else "No runs")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        counts = [f"{label} ({(reached['label'] == label).sum()}/{(table['label'] == label).sum()} reached)"
                  for label in labels]
        ax.set_yticks(range(len(labels)), counts)
    ax.set_ylabel("")
    ax.set_xlabel("train time to target (s)")
    never = [label for label in labels if label not in set(reached["label"].astype(str))]
    title = f"Train time to reach the {target_text} (mean, 95% CI)"
    if never and not reached.empty:
        title += "\nnever reached by: " + ", ".join(never)
    ax.set_title(title, loc="left")
    return fig

def _human_bytes(value: float) -> str:
    """1234567 -> '1.23 MB' (decimal units)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.3g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")

def plot_bytes_per_sample(table: pd.DataFrame, styles: dict[str, Style] | None = None) -> Figure:
    """summary (runs x columns) -> a horizontal bar per label: bytes sent (all ranks) per training sample, mean,
    95% bootstrap CI.

    The value axis is logarithmic when the labels' positive means span more than 100x. Each bar carries its mean.
    """
    labels = [str(label) for label in pd.unique(table["label"])]
    fig, ax, data = _bars(table, "bytes_per_sample", labels, styles)
    if data.empty:
        note(ax, "No run recorded bytes and samples")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        means = data.groupby("label")["bytes_per_sample"].mean()
        positive = means[means > 0]
        if len(positive) and positive.max() / positive.min() > 100:
            ax.set_xscale("log")
        for position, label in enumerate(labels):
            if label in means and means[label] > 0:
                ax.annotate(_human_bytes(means[label]), (means[label], position), xytext=(3, 0),
                            textcoords="offset points", ha="left", va="center", fontsize="small")
            elif label in means:
                ax.text(0.01, position, "0 B", va="center", transform=ax.get_yaxis_transform(), fontsize="small")
    ax.set_ylabel("")
    ax.set_xlabel("bytes sent per sample (all ranks)" + (", log scale" if ax.get_xscale() == "log" else ""))
    ax.set_title("Communication per training sample (mean over seeds, 95% CI)", loc="left")
    return fig

def plot_improvement(poi: pd.DataFrame, baseline: str, styles: dict[str, Style] | None = None) -> Figure:
    """probability of improvement (rows: label, metric, poi, poi_low, poi_high) -> one panel per metric, a
    horizontal bar per label with its 95% stratified bootstrap interval, and a line at 0.5 (no better, no worse)."""
    metrics = list(pd.unique(poi["metric"]))
    labels = [str(label) for label in pd.unique(poi["label"])]
    chosen = styles_for(labels, styles)
    fig = new_figure(4.2 * max(1, len(metrics)) + 2.5, bar_height(len(labels)))
    axes = np.atleast_1d(fig.subplots(1, max(1, len(metrics)), sharey=True))
    for ax, metric in zip(axes, metrics, strict=False):
        rows = poi[poi["metric"] == metric].set_index("label")
        for position, label in enumerate(labels):
            if label not in rows.index or not np.isfinite(rows.loc[label, "poi"]):
                continue
            row = rows.loc[label]
            low, high = row["poi_low"], row["poi_high"]
            error = None if np.isnan(low) else [[row["poi"] - low], [high - row["poi"]]]
            ax.barh(position, row["poi"], xerr=error, color=chosen[label].color, capsize=3)
            ax.text(0.01, position, f"{row['poi']:.2f}", va="center", fontsize="small",
                    transform=ax.get_yaxis_transform(), bbox={"facecolor": "white", "alpha": 0.8, "pad": 1,
                                                              "linewidth": 0})
        ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xlabel(f"P({metric} better than {baseline})")
    axes[0].set_ylim(len(labels) - 0.5, -0.5)  # the first label on top (the axes share y)
    fig.suptitle(f"Probability of improvement over {baseline} (95% stratified bootstrap CI)")
    return fig

def plot_performance_profile(profile: pd.DataFrame, styles: dict[str, Style] | None = None) -> Figure:
    """performance profile (rows: label, tau, rho) -> a step line per label: the share of problems (workload, network,
    seed) it solved within tau times the fastest time to target (AlgoPerf; report/profiles.py)."""
    fig = new_figure()
    ax = fig.subplots()
    labels = [str(label) for label in pd.unique(profile["label"])]
    chosen = styles_for(labels, styles)
    for label in labels:
        rows = profile[profile["label"] == label]
        style = chosen[label]
        ax.step(rows["tau"], rows["rho"], where="post", label=label, color=style.color,
                linestyle=(0, style.dashes) if style.dashes else "-")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("tau: time to target within tau x the fastest on the problem")
    ax.set_ylabel("share of problems")
    ax.set_title("Performance profiles (AlgoPerf), over workloads and seeds")
    ax.legend(fontsize="small")
    return fig
