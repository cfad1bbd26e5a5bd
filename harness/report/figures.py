"""Figures of the report: the figure factory, accuracy curves, time to target as survival, bytes per sample,
probability of improvement and performance profiles, one panel per workload. Colours follow the label
(report/styles.py)."""

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


#: The largest magnitude a plotted value may have: matplotlib cannot tick an axis that reaches near the float limit
#: (1e308, which only a corrupt record holds: a float32 loss stops at 3.4e38), so plots leave such values out.
PLOTTABLE = 1e100


def plottable(values: Any) -> np.ndarray:
    """Which values a plot can show: finite, and at most PLOTTABLE in magnitude."""
    return np.abs(np.asarray(values, dtype=float)) <= PLOTTABLE


def new_figure(width: float = 7.5, height: float = 4.5) -> Figure:
    """A new figure with no pyplot state, rendered with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")

def note(ax: Any, text: str, bare: bool = False) -> None:
    """Write a centred message on an axes that has nothing else to show; `bare` also clears its ticks."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=11)
    if bare:
        ax.set_xticks([])
        ax.set_yticks([])

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

def panel_keys(frame: pd.DataFrame) -> list[str | None]:
    """The workloads of a table in order of first appearance, one panel each; [None] without a workload column."""
    if "workload" not in frame.columns or frame.empty:
        return [None]
    return [str(w) for w in pd.unique(frame["workload"].astype(str))]

def in_panel(frame: pd.DataFrame, key: str | None) -> pd.DataFrame:
    """The rows of one panel (all rows for the panel None)."""
    return frame if key is None else frame[frame["workload"].astype(str) == key]

def legend_outside(fig: Figure, axes: Sequence[Any]) -> None:
    """One legend for every panel, right of them (outside the data): each label once, in order of appearance."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside center right", fontsize="small",
                   frameon=False)

def spans_a_decade(values: Sequence[float]) -> bool:
    """Whether positive values span more than 10x (a log axis then shows all of them)."""
    positive = [float(v) for v in values if np.isfinite(v) and v > 0]
    return len(positive) > 1 and max(positive) / min(positive) > 10

def log_axis(ax: Any, axis: str = "x") -> None:
    """Make an axis logarithmic (call it after drawing the data) with plain tick labels (0.1, 1, 10; 1, 2, 5 steps
    when the data span less than two decades) and no labels on the minor ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    getattr(ax, f"set_{axis}scale")("log")
    target = getattr(ax, f"{axis}axis")
    low, high = (abs(v) for v in target.get_view_interval())
    if low > 0 and high / low < 100:  # within two decades: 1, 2, 5, 10, ..., so that some ticks show
        target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())

def plot_accuracy(curve_table: pd.DataFrame, x_label: str, target: float | None = None,
                  styles: dict[str, Style] | None = None, y: str = "test_accuracy", y_label: str = "test accuracy",
                  what: str = "Test accuracy", interval: str = stats.CI_WORDS) -> Figure:
    """curves (rows x CURVE_COLUMNS [+ workload]) -> one panel per workload, a line per label: the mean of `y`
    over seeds with 95% CI bands (stats.bootstrap_ci95, as seaborn's errorbar=("ci", 95)); `interval` names them
    in the title (stats.interval_words: with 2 seeds they are min–max ranges).

    Colours and dashes from `styles` (label_styles of the summary), one legend outside the panels. A panel's x
    axis is logarithmic when its labels' curves end more than a decade apart (x = 0 is then off the axis), and
    the y axis of a y other than accuracy (the loss) when its values span more than 100x.
    """
    import seaborn as sns

    data = curve_table.dropna(subset=[y])
    keys = panel_keys(data)
    columns = 1 if len(keys) <= 3 else 2  # panels stacked: each as wide as a lone plot
    rows = -(-len(keys) // columns)
    fig = new_figure(6.2 * columns + 3.0, 2.9 * rows + 0.9)
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax, key in zip(axes, keys, strict=False):
        panel = in_panel(data, key)
        if panel.empty:
            note(ax, "no records to plot")
        else:
            panel = panel.astype({"x": float, y: float, "label": str})
            labels = list(pd.unique(panel["label"]))
            chosen = styles_for(labels, styles)
            sns.lineplot(data=panel, x="x", y=y, hue="label", style="label", hue_order=labels, style_order=labels,
                         palette={k: chosen[k].color for k in labels},
                         dashes={k: chosen[k].dashes or "" for k in labels}, errorbar=stats.bootstrap_ci95, ax=ax)
            if spans_a_decade(panel.groupby("label")["x"].max()):
                log_axis(ax)
                ax.set_xlim(left=float(panel.loc[panel["x"] > 0, "x"].min()))
            values = panel[y][panel[y] > 0]
            if y != "test_accuracy" and len(values) and values.max() / values.min() > 100:
                log_axis(ax, "y")  # a loss that blew up would flatten every other curve
            if target is not None and y in ("test_accuracy", "test_loss"):
                ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel(x_label + (", log scale" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel(y_label + (", log scale" if ax.get_yscale() == "log" else ""))
        if key is not None and len(keys) > 1:
            ax.set_title(key, fontsize="medium")
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    legend_outside(fig, axes)
    where = f" on {keys[0]}" if len(keys) == 1 and keys[0] is not None else ""
    x_name = x_label.split(" (")[0].removesuffix(" on")  # 'tokens trained on' + ' on shakespeare-gpt'
    fig.suptitle(f"{what} vs {x_name}{where} (mean over seeds, {interval})")
    return fig

def bar_panels(table: pd.DataFrame, value: str, styles: dict[str, Style] | None, width: float = 9.0,
               log: bool = True) -> tuple[Figure, list[tuple[Any, str | None, list[str], pd.DataFrame]]]:
    """A panel per workload, stacked, each as tall as its labels need: a horizontal bar per label (mean of `value`
    over its runs with a finite one a plot can show, 95% bootstrap interval); with `log`, a log axis where the means
    span more than a decade. -> (figure, [(axes, workload, labels, data)])."""
    import seaborn as sns

    keys = panel_keys(table)
    counts = [max(1, in_panel(table, key)["label"].nunique()) for key in keys]
    fig = new_figure(width, sum(bar_height(n) - (0.6 if len(keys) > 1 else 0.0) for n in counts))
    axes = np.atleast_1d(fig.subplots(len(keys), 1, squeeze=False, height_ratios=counts).ravel())
    panels = []
    for ax, key in zip(axes, keys, strict=True):
        rows = in_panel(table, key)
        labels = [str(label) for label in pd.unique(rows["label"])]
        chosen = styles_for(labels, styles)
        data = rows[plottable(rows[value])].astype({value: float, "label": str})
        if not data.empty:
            sns.barplot(data=data, y="label", x=value, order=labels, hue="label", hue_order=labels, legend=False,
                        palette={k: chosen[k].color for k in labels}, errorbar=stats.bootstrap_ci95, ax=ax)
            if log and spans_a_decade(data.groupby("label")[value].mean()):
                log_axis(ax)
        ax.set_ylabel("")
        panels.append((ax, key, labels, data))
    return fig, panels

def bar_ends(data: pd.DataFrame, value: str) -> dict[str, float]:
    """label -> where its bar's error bar ends (the upper bootstrap bound, or the mean without one): value labels
    are placed beyond it, so they never sit on the bar's interval."""
    ends = {}
    for label, group in data.groupby("label", sort=False):
        values = group[value].to_numpy(dtype=float)
        high = stats.bootstrap_ci95(values)[1]
        ends[str(label)] = float(values.mean()) if np.isnan(high) else max(float(values.mean()), high)
    return ends

def label_bars(ax: Any, labels: Sequence[str], data: pd.DataFrame, value: str, text: Any) -> None:
    """Write each bar's mean, text(mean), just beyond its error bar (bar_ends); a zero mean is written at the axis
    ('0 B' for bytes), where no bar is."""
    means = data.groupby("label")[value].mean()
    ends = bar_ends(data, value)
    for position, label in enumerate(labels):
        if label in means and means[label] > 0:
            ax.annotate(text(means[label]), (ends[label], position), xytext=(4, 0), textcoords="offset points",
                        ha="left", va="center", fontsize="small")
        elif label in means:
            ax.text(0.01, position, text(0.0), va="center", transform=ax.get_yaxis_transform(), fontsize="small")
    ax.margins(x=0.12)

def panel_title(ax: Any, key: str | None, several: bool, title: str, extra: str = "") -> None:
    """A bar panel's title: the plot's title on a lone panel, the workload on each of several; `extra` under it."""
    text = (key or "") if several else title
    ax.set_title(text + (f"\n{extra}" if extra else ""), loc="left", fontsize="medium")

#: How a run censored before the target is marked on its survival curve: a missed target (a tick) and a diverged
#: run (a cross), with the legend's words for each.
CENSOR_MARKS = {"missed": ("|", "censored: missed the target by its train time"),
                "diverged": ("x", "diverged: never reaches the target (x where it diverged)")}


def survival_rows(table: pd.DataFrame) -> pd.DataFrame:
    """summary (runs x columns) -> the runs a survival curve shows, completed or diverged ones with a finite train
    time, with `time` (the time to target where the run reached it, else its train time: where its mark goes),
    `reached` and `mark` (CENSOR_MARKS' key of a run that did not reach it). A diverged run never reaches the target,
    even one that passed it before it blew up: the estimate censors it at +inf (kaplan_meier), so it counts as a
    seed that never arrived, not as one that might have arrived later."""
    rows = table[table["state"].isin(("completed", "diverged"))]
    reach = pd.to_numeric(rows["time_to_target_s"], errors="coerce").astype(float)
    train = pd.to_numeric(rows["train_time_s"], errors="coerce").astype(float)
    diverged = rows["state"] == "diverged"
    reached = np.isfinite(reach) & ~diverged
    out = rows.assign(time=reach.where(reached, train), reached=reached,
                      mark=np.where(diverged, "diverged", np.where(reached, "", "missed")))
    return out[np.isfinite(out["time"].to_numpy(dtype=float)) & (out["time"] >= 0) & plottable(out["time"])]


def plot_time_to_target_survival(table: pd.DataFrame, target: float | None = None,
                                 styles: dict[str, Style] | None = None,
                                 targets: dict[str, str] | None = None) -> Figure:
    """summary (runs x columns) -> per workload, a Kaplan–Meier curve per label (report/survival.py): the fraction
    of its seeds at the target, 1 - S(t), against train time on a log axis, a step up at each time a seed reached it.

    The runs are survival_rows: a run that missed the target is censored at its train time and marked on its
    curve with a tick; a diverged run, which never reaches it (censored at +inf), with a cross where it diverged
    (CENSOR_MARKS; the legend says which is which). A curve ends at
    its label's last time, so a label with seeds that never arrived plateaus below 1 and ends on a mark. A time of 0
    (the target met before training) sits at the axis' left end. `targets`: {workload: 'target loss 2.9'}, each
    panel's title; without it, the accuracy `target`.
    """
    from matplotlib.lines import Line2D

    from harness.report.survival import kaplan_meier

    rows_all = survival_rows(table)
    keys = panel_keys(table)
    fig = new_figure(10.5, 3.1 * len(keys) + 0.9)
    axes = np.atleast_1d(fig.subplots(len(keys), 1, squeeze=False).ravel())
    marks: set[str] = set()
    for ax, key in zip(axes, keys, strict=True):
        rows = in_panel(rows_all, key)
        labels = [str(label) for label in pd.unique(in_panel(table, key)["label"])]
        chosen = styles_for(labels, styles)
        times = rows["time"].to_numpy(dtype=float)
        if rows.empty:
            note(ax, "No run completed or diverged", bare=True)
        else:
            positive = times[times > 0]
            floor = positive.min() / 2 if len(positive) else 1.0
            high = max(times.max(), floor * 4)
            for label in labels:
                mine = rows[rows["label"].astype(str) == label]
                if mine.empty:
                    continue
                style = chosen[label]
                t = np.maximum(mine["time"].to_numpy(dtype=float), floor)
                never = (mine["mark"] == "diverged").to_numpy()
                km = kaplan_meier(np.where(never, np.inf, t), mine["reached"].to_numpy(dtype=bool))
                xs = [floor, *km.times, t.max()]
                ys = [0.0, *(1.0 - km.survival), 1.0 - (km.survival[-1] if len(km.survival) else 1.0)]
                ax.step(xs, ys, where="post", color=style.color, label=label, linewidth=1.6,
                        linestyle=(0, style.dashes) if style.dashes else "-")
                for mark, (marker, _) in CENSOR_MARKS.items():
                    censored = t[(mine["mark"] == mark).to_numpy()]
                    if len(censored):
                        marks.add(mark)
                        ax.plot(censored, 1.0 - km.at(censored), linestyle="none", marker=marker, markersize=11,
                                markeredgewidth=2, color=style.color)
            ax.set_xlim(floor, high * 1.3)
            log_axis(ax)
            ax.set_xlim(floor, high * 1.3)
        ax.set_ylim(-0.04, 1.04)
        ax.set_xlabel("train time (s), log scale")
        ax.set_ylabel("fraction of seeds\nat target")
        what = (targets or {}).get(key or "") or (f"target accuracy {target:g}" if target is not None else "")
        ax.set_title(": ".join(part for part in (key, what) if part), loc="left", fontsize="medium")
    for mark in CENSOR_MARKS:
        if mark in marks:
            marker, words = CENSOR_MARKS[mark]
            axes[0].add_line(Line2D([], [], linestyle="none", marker=marker, markersize=9, markeredgewidth=2,
                                    color="0.3", label=words))
    legend_outside(fig, axes)
    fig.suptitle("Time to target as survival: fraction of seeds at the target against train time (Kaplan–Meier)")
    return fig

def _human_bytes(value: float) -> str:
    """1234567 -> '1.23 MB' (decimal units)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.3g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")

def plot_bytes_per_sample(table: pd.DataFrame, styles: dict[str, Style] | None = None,
                          interval: str = stats.CI_WORDS) -> Figure:
    """summary (runs x columns) -> per workload, a horizontal bar per label: bytes sent (all ranks) per training
    sample, mean, 95% bootstrap CI.

    The value axis is logarithmic when the labels' positive means span more than 100x. Each bar carries its mean,
    written beyond its error bar.
    """
    title = f"Communication per training sample (mean over seeds, {interval})"
    fig, panels = bar_panels(table, "bytes_per_sample", styles, log=False)
    for ax, key, labels, data in panels:
        if data.empty:
            note(ax, "No run recorded bytes and samples", bare=True)
        else:
            means = data.groupby("label")["bytes_per_sample"].mean()
            positive = means[means > 0]
            if len(positive) and positive.max() / positive.min() > 100:
                log_axis(ax)
            label_bars(ax, labels, data, "bytes_per_sample", _human_bytes)
        ax.set_xlabel("bytes sent per sample (all ranks)" + (", log scale" if ax.get_xscale() == "log" else ""))
        panel_title(ax, key, len(panels) > 1, title)
    if len(panels) > 1:
        fig.suptitle(title)
    return fig

def plot_improvement(poi: pd.DataFrame, baseline: str, styles: dict[str, Style] | None = None) -> Figure:
    """probability of improvement (rows: [workload,] label, metric, poi, poi_low, poi_high) -> one panel per metric,
    a horizontal bar per label and workload (each compared with its workload's baseline; the tick says 'label on
    workload' when there are several) with its 95% stratified bootstrap interval, and a line at 0.5 (no better, no
    worse)."""
    metrics = list(pd.unique(poi["metric"]))
    poi = poi if "workload" in poi.columns else poi.assign(workload="")
    keys = list(dict.fromkeys(zip(poi["workload"].astype(str), poi["label"].astype(str), strict=True)))
    several = len({workload for workload, _ in keys}) > 1
    ticks = [f"{label} on {workload}" if several else label for workload, label in keys]
    chosen = styles_for(list(dict.fromkeys(label for _, label in keys)), styles)
    fig = new_figure(4.2 * max(1, len(metrics)) + 2.5 + (1.5 if several else 0.0), bar_height(len(keys)))
    axes = np.atleast_1d(fig.subplots(1, max(1, len(metrics)), sharey=True))
    for ax, metric in zip(axes, metrics, strict=False):
        rows = poi[poi["metric"] == metric].set_index(["workload", "label"])
        for position, key in enumerate(keys):
            label = key[1]
            if key not in rows.index or not np.isfinite(rows.loc[key, "poi"]):
                continue
            row = rows.loc[key]
            low, high = row["poi_low"], row["poi_high"]
            error = None if np.isnan(low) else [[row["poi"] - low], [high - row["poi"]]]
            ax.barh(position, row["poi"], xerr=error, color=chosen[label].color, capsize=3)
            ax.text(0.01, position, f"{row['poi']:.2f}", va="center", fontsize="small",
                    transform=ax.get_yaxis_transform(), bbox={"facecolor": "white", "alpha": 0.8, "pad": 1,
                                                              "linewidth": 0})
        ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_yticks(range(len(keys)), ticks)
        ax.set_xlabel(f"P({metric} better than {baseline})")
    axes[0].set_ylim(len(keys) - 0.5, -0.5)  # the first label on top (the axes share y)
    fig.suptitle(f"Probability of improvement over {baseline} (95% stratified bootstrap CI)")
    return fig

def plot_performance_profile(profile: pd.DataFrame, styles: dict[str, Style] | None = None) -> Figure:
    """performance profile (rows: label, tau, rho) -> a step line per label: the share of problems (workload, network,
    seed) it solved within tau times the fastest time to target (AlgoPerf; report/performance_profiles.py)."""
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
    legend_outside(fig, [ax])
    return fig
