"""The suite report: per-run summary, aggregates over seeds, seaborn plots and a self-contained HTML page."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from harness.report_pipeline import gantt_figures, measured_bubble
from harness.results import RunResult, load_suite

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The summary.csv contract, in order (docs/results.md); EXTRA_COLUMNS follow.
SUMMARY_COLUMNS = (
    "suite", "run_id", "method", "workload", "world_size", "seed", "state", "final_accuracy", "best_accuracy",
    "time_to_target_s", "train_time_s", "total_bytes", "bytes_per_sample",
)  # fmt: skip
EXTRA_COLUMNS = ("label", "family", "steps", "epochs", "network", "samples_per_s", "bubble")
CURVE_COLUMNS = ("label", "seed", "run_id", "x", "test_accuracy")
#: Summary columns that the per-label aggregate averages over seeds, with their display names.
AGGREGATED = {
    "final_accuracy": "final accuracy",
    "time_to_target_s": "time to target (s)",
    "train_time_s": "train time (s)",
    "bytes_per_sample": "bytes / sample",
}
X_AXES = {"train_time_s": "train time (s)", "epoch": "epoch"}
#: The record kinds the report reads (docs/results.md); records of other kinds are ignored.
KNOWN_KINDS = ("train", "eval", "comm")


# ---------------------------------------------------------------------------------------------------- tables


def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """frame[column] as floats (NaN where missing or not a number); all NaN when the column is absent."""
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def _lowest_rank(records: pd.DataFrame) -> pd.DataFrame:
    """The records of the lowest rank present (rank 0 in a healthy run); all of them when none has a rank."""
    ranks = _numeric(records, "rank")
    return records[ranks == ranks.min()] if ranks.notna().any() else records


def eval_records(metrics: pd.DataFrame) -> pd.DataFrame:
    """metrics (records x fields) -> the `eval` records of the lowest rank that wrote any (rank 0)."""
    return _lowest_rank(metrics[metrics["kind"] == "eval"])


def _last(values: pd.Series) -> float:
    """The last non-NaN value, or NaN."""
    values = values.dropna()
    return float(values.iloc[-1]) if len(values) else math.nan


def run_summary(run: RunResult) -> dict[str, Any]:
    """One run -> one summary row (a dict keyed by SUMMARY_COLUMNS + EXTRA_COLUMNS); see `summary`."""
    spec, metrics = run.spec, run.metrics
    evals = eval_records(metrics)
    accuracy = _numeric(evals, "test_accuracy")
    target = (spec.get("budget") or {}).get("target_accuracy")
    time_to_target = math.nan
    if target is not None and (accuracy >= target).any():
        time_to_target = float(_numeric(evals, "train_time_s")[accuracy >= target].iloc[0])

    rank0 = _lowest_rank(metrics[metrics["kind"].isin(KNOWN_KINDS)])
    train = metrics[metrics["kind"] == "train"]
    sent = _numeric(train, "bytes_sent")
    has_bytes = sent.notna() & _numeric(train, "rank").notna()
    total_bytes = int(round(sent[has_bytes].groupby(_numeric(train, "rank")[has_bytes]).last().sum()))
    samples = _last(_numeric(_lowest_rank(train), "samples"))
    train_time = float(_numeric(rank0, "train_time_s").max())
    return {
        "suite": spec.get("suite"),
        "run_id": spec.get("run_id") or run.run_dir.name,
        "method": spec.get("method"),
        "workload": spec.get("workload"),
        "world_size": spec.get("world_size"),
        "seed": spec.get("seed"),
        "state": run.state,
        "final_accuracy": _last(accuracy),
        "best_accuracy": float(accuracy.max()) if accuracy.notna().any() else math.nan,
        "time_to_target_s": time_to_target,
        "train_time_s": train_time,
        "total_bytes": total_bytes,
        "bytes_per_sample": total_bytes / samples if samples > 0 else math.nan,
        "label": run.label,
        "family": spec.get("family"),
        "steps": _numeric(rank0, "step").max(),
        "epochs": float(_numeric(rank0, "epoch").max()),
        "network": network_text(spec),
        "samples_per_s": samples / train_time if samples > 0 and train_time > 0 else math.nan,
        "bubble": measured_bubble(run),
    }


def network_text(spec: dict[str, Any]) -> str:
    """A spec's emulated network in the --network form ('100mbit,latency=1ms'); '' for none (loopback)."""
    network = spec.get("network")
    if not isinstance(network, dict):
        return ""
    return str(network.get("rate") or "unlimited") + (f",latency={network['latency']}" if network.get("latency")
                                                      else "")


def summary(runs: Sequence[RunResult]) -> pd.DataFrame:
    """runs -> DataFrame (runs x SUMMARY_COLUMNS + EXTRA_COLUMNS), one row per run in the given order.

    - final_accuracy / best_accuracy: test_accuracy of the last `eval` record / the best one (NaN if none).
    - time_to_target_s: train_time_s of the first eval record with test_accuracy >=
      spec["budget"]["target_accuracy"]; NaN (an empty cell in summary.csv) if never reached or no target.
    - train_time_s: the largest train_time_s of rank 0's records of KNOWN_KINDS (other kinds are ignored).
    - total_bytes: sum over ranks of the bytes_sent of each rank's last train record that has one (else 0).
    - bytes_per_sample: total_bytes / the (global) samples of rank 0's last train record; NaN if 0 or missing.
    - state: status.json's state, "unknown" when it is missing.
    - steps / epochs: the largest step / epoch of rank 0's records of KNOWN_KINDS.
    - network: the emulated network in the --network form ('100mbit', 'unlimited,latency=1ms'); empty for none.
    - samples_per_s: throughput, rank 0's last global samples / train_time_s (NaN when either is 0 or missing).
    - bubble: a multi-process pipeline run's measured idle share, from its `trace` records (NaN for others).
    A run without metrics still gets a row (NaN metrics, 0 bytes).
    """
    table = pd.DataFrame([run_summary(run) for run in runs], columns=[*SUMMARY_COLUMNS, *EXTRA_COLUMNS])
    table["total_bytes"] = table["total_bytes"].astype("int64")
    table["steps"] = table["steps"].astype("Float64").round().astype("Int64")
    return table


def mean_ci95(values: Sequence[float] | pd.Series) -> tuple[float, float, int]:
    """values: 1-D (runs) -> (mean, 95% Student-t confidence interval half-width, n) of the finite ones.

    The half-width is NaN with fewer than two finite values; all three are NaN/0 with none.
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(finite[0]), math.nan, 1
    from scipy import stats

    half = stats.t.ppf(0.975, n - 1) * finite.std(ddof=1) / math.sqrt(n)
    return float(finite.mean()), float(half), n


def aggregate(table: pd.DataFrame, states: Sequence[str] | None = ("completed",)) -> pd.DataFrame:
    """summary (runs x columns) -> DataFrame (labels x columns), labels in order of first appearance.

    Columns: label, runs (all the label's runs), completed, used (runs whose state is in `states`, or all runs
    when states is None: only these enter the statistics), then for each AGGREGATED metric m: m_mean, m_ci95
    (95% Student-t half-width over seeds) and m_n (used runs with a finite value; for time_to_target_s, those
    that reached the target).
    """
    rows = []
    for label in pd.unique(table["label"]):
        group = table[table["label"] == label]
        used = group if states is None else group[group["state"].isin(states)]
        row: dict[str, Any] = {
            "label": label,
            "runs": len(group),
            "completed": int((group["state"] == "completed").sum()),
            "used": len(used),
        }
        for metric in AGGREGATED:
            row[f"{metric}_mean"], row[f"{metric}_ci95"], row[f"{metric}_n"] = mean_ci95(used[metric])
        rows.append(row)
    columns = ["label", "runs", "completed", "used"]
    columns += [f"{m}_{s}" for m in AGGREGATED for s in ("mean", "ci95", "n")]
    return pd.DataFrame(rows, columns=columns)


def curves(runs: Sequence[RunResult], x: str = "train_time_s", grid_points: int = 100) -> pd.DataFrame:
    """runs -> DataFrame (runs·grid_points x CURVE_COLUMNS): each run's test accuracy on its label's grid.

    Each run's rank-0 eval records (test_accuracy against `x`: "train_time_s" or "epoch") are interpolated
    with np.interp onto one grid per label: grid_points evenly spaced values from 0 to the *smallest* final x
    among that label's runs, so that every seed covers the whole grid and seaborn aggregates the same seeds at
    identical x (longer seeds are cut there). The runner evaluates before the first step, so every run starts
    at x = 0; for runs that do not, the grid starts at the latest first evaluation among the label's runs
    instead, and where they do not overlap at all a run is NaN before its first evaluation: nothing is
    extrapolated. Runs without eval records are left out and do not shorten their label's grid.
    """
    if x not in X_AXES:
        raise ValueError(f"curves: x must be one of {sorted(X_AXES)}, not {x!r}")
    if grid_points < 2:
        raise ValueError(f"curves: grid_points must be at least 2, not {grid_points}")
    by_label: dict[str, list[tuple[RunResult, np.ndarray, np.ndarray]]] = {}
    for run in runs:
        evals = eval_records(run.metrics)
        xs, accuracy = _numeric(evals, x).to_numpy(), _numeric(evals, "test_accuracy").to_numpy()
        keep = np.isfinite(xs) & np.isfinite(accuracy)
        if keep.any():
            order = np.argsort(xs[keep], kind="stable")
            by_label.setdefault(run.label, []).append((run, xs[keep][order], accuracy[keep][order]))
    frames = []
    for label, members in by_label.items():
        start, end = max(xs[0] for _, xs, _ in members), min(xs[-1] for _, xs, _ in members)
        grid = np.linspace(start if 0 < start <= end else 0.0, end, grid_points)
        for run, xs, accuracy in members:
            frames.append(pd.DataFrame({
                "label": label,
                "seed": run.spec.get("seed"),
                "run_id": run.spec.get("run_id") or run.run_dir.name,
                "x": grid,
                "test_accuracy": np.interp(grid, xs, accuracy, left=np.nan),
            }))  # fmt: skip
    if not frames:
        return pd.DataFrame(columns=list(CURVE_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def failures(runs: Sequence[RunResult]) -> pd.DataFrame:
    """runs -> DataFrame (runs not completed x [run_id, label, state, rank, message]), from status.json."""
    rows = []
    for run in runs:
        if run.state == "completed":
            continue
        error = (run.status or {}).get("error")
        if isinstance(error, dict):
            message, rank = str(error.get("message") or ""), error.get("rank")
        else:
            message, rank = ("" if error is None else str(error)), None
        if run.status is None:
            message = message or "no readable status.json"
        run_id = run.spec.get("run_id") or run.run_dir.name
        rows.append({"run_id": run_id, "label": run.label, "state": run.state, "rank": rank,
                     "message": message})
    return pd.DataFrame(rows, columns=["run_id", "label", "state", "rank", "message"])


def common_target(runs: Sequence[RunResult]) -> float | None:
    """The target accuracy shared by every run's budget, or None when they set none or differ."""
    targets = {(run.spec.get("budget") or {}).get("target_accuracy") for run in runs}
    return targets.pop() if len(targets) == 1 else None


# ----------------------------------------------------------------------------------------------------- plots


def bootstrap_ci95(values: Sequence[float] | pd.Series, n_boot: int = 1000,
                   seed: int = 0) -> tuple[float, float]:
    """values: 1-D (seeds) -> (low, high) of the 95% percentile-bootstrap interval of their mean.

    The statistic of seaborn's errorbar=("ci", 95) (n_boot resamples, 2.5th and 97.5th percentiles),
    vectorized: seaborn resamples in a Python loop, which takes seconds per curve at 100 grid points.
    Seeded, so a report repeats exactly.
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if len(finite) < 2:
        return math.nan, math.nan
    resamples = np.random.default_rng(seed).integers(0, len(finite), size=(n_boot, len(finite)))
    low, high = np.percentile(finite[resamples].mean(axis=1), [2.5, 97.5])
    return float(low), float(high)


def _figure(width: float = 7.5, height: float = 4.5) -> Figure:
    """A new figure with no pyplot state, rendered with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _note(ax: Any, text: str) -> None:
    """Write a centred message on an axes that has nothing else to show."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=11)


def _label_ticks(ax: Any, labels: Sequence[str]) -> None:
    """Slant category tick labels when they would collide."""
    if len(labels) > 3 or max((len(label) for label in labels), default=0) > 14:
        ax.tick_params(axis="x", labelrotation=25)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")


def plot_accuracy(curve_table: pd.DataFrame, x_label: str, target: float | None = None) -> Figure:
    """curves (rows x CURVE_COLUMNS) -> a line per label: mean test accuracy over seeds with 95% CI bands.

    The bands are seaborn's errorbar=("ci", 95), computed by bootstrap_ci95 (the same bootstrap, vectorized).
    """
    import seaborn as sns

    fig = _figure()
    ax = fig.subplots()
    data = curve_table.dropna(subset=["test_accuracy"])
    if data.empty:
        _note(ax, "no evaluation records to plot")
    else:
        data = data.astype({"x": float, "test_accuracy": float})
        sns.lineplot(data=data, x="x", y="test_accuracy", hue="label", errorbar=bootstrap_ci95, ax=ax)
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

    fig = _figure()
    ax = fig.subplots()
    target_text = f"target accuracy {target:g}" if target is not None else "target accuracy"
    labels = [str(label) for label in pd.unique(table["label"])]
    reached = table[np.isfinite(table["time_to_target_s"].astype(float))]
    if reached.empty:
        _note(ax, f"No run reached the {target_text}" if labels else "No runs")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        data = reached.astype({"time_to_target_s": float, "label": str})
        sns.barplot(data=data, x="label", y="time_to_target_s", order=labels, errorbar=("ci", 95), seed=0,
                    ax=ax)
        counts = [f"{label}\n({(data['label'] == label).sum()}/{(table['label'] == label).sum()} reached)"
                  for label in labels]
        ax.set_xticks(range(len(labels)), counts)
        _label_ticks(ax, labels)
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

    fig = _figure()
    ax = fig.subplots()
    labels = [str(label) for label in pd.unique(table["label"])]
    data = table[np.isfinite(table["bytes_per_sample"].astype(float))]
    data = data.astype({"bytes_per_sample": float, "label": str})
    if data.empty:
        _note(ax, "No run recorded bytes and samples")
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
        _label_ticks(ax, labels)
    ax.set_xlabel("")
    ax.set_ylabel("bytes sent per sample (all ranks)" + (", log scale" if ax.get_yscale() == "log" else ""))
    ax.set_title("Communication per training sample (mean over seeds, 95% CI)")
    return fig


def head_accuracies(runs: Sequence[RunResult]) -> pd.DataFrame:
    """runs -> one row per (run, chunk) with the final accuracy of each chunk's auxiliary head.

    Read from the last eval record's `head_accuracy` list (written by methods with local losses); runs without it
    contribute nothing. Columns: label, seed, run_id, chunk (1-based), head_accuracy.
    """
    rows = []
    for run in runs:
        evals = eval_records(run.metrics)
        if "head_accuracy" not in evals.columns:
            continue
        heads = [v for v in evals["head_accuracy"] if isinstance(v, list)]
        if heads:
            rows += [{"label": run.label, "seed": run.spec.get("seed"), "run_id": run.run_dir.name, "chunk": c + 1,
                      "head_accuracy": float(a)} for c, a in enumerate(heads[-1])]
    return pd.DataFrame(rows, columns=["label", "seed", "run_id", "chunk", "head_accuracy"])


def plot_head_accuracy(heads: pd.DataFrame) -> Figure:
    """head_accuracies (rows) -> bars of each chunk's final head accuracy per label (mean over seeds, 95% CI):
    how the representation improves with depth under local losses."""
    import seaborn as sns

    fig = _figure()
    ax = fig.subplots()
    sns.barplot(data=heads.astype({"label": str}), x="chunk", y="head_accuracy", hue="label", errorbar=("ci", 95),
                seed=0, ax=ax)
    ax.set_ylim(max(0.0, heads["head_accuracy"].min() - 0.1), 1.0)
    ax.set_xlabel("chunk (input side first)")
    ax.set_ylabel("final test accuracy of the chunk's head")
    ax.set_title("Per-chunk head accuracy (mean over seeds, 95% CI)")
    ax.legend(title=None, fontsize="small")
    return fig


def network_order(networks: Sequence[str]) -> list[str]:
    """Distinct networks (--network form) from the slowest to the fastest: by rate, then larger latency first;
    'unlimited' after every rate and '' (no emulation, loopback) last."""
    from harness.network import parse_network

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


def network_speedup(table: pd.DataFrame, baseline: str = "ddp") -> pd.DataFrame:
    """summary (runs x columns) -> DataFrame (method labels · networks x columns), networks slowest first.

    Columns: method_label (the label without its network), network, runs, samples_per_s and time_to_target_s (means
    over the seeds; time only over the runs that reached the target), throughput_speedup (samples_per_s over that of
    the `baseline` method's label at the same network) and time_speedup (the baseline's time to target over this
    one's): above 1 where the method beats the baseline. The speed-ups are NaN where the baseline has no value.
    """
    networks = table["network"].fillna("").astype(str)
    data = table.assign(network=networks, method_label=[
        method_label(str(label), network) for label, network in zip(table["label"], networks, strict=True)])
    rows = []
    for (label, network), group in data.groupby(["method_label", "network"], sort=False):
        rows.append({"method_label": label, "network": network, "method": group["method"].iloc[0],
                     "runs": len(group), "samples_per_s": group["samples_per_s"].astype(float).mean(),
                     "time_to_target_s": group["time_to_target_s"].astype(float).mean()})
    frame = pd.DataFrame(rows, columns=["method_label", "network", "method", "runs", "samples_per_s",
                                        "time_to_target_s"])
    base = frame[frame["method"] == baseline]
    base = base[base["method_label"] == base["method_label"].iloc[0]] if len(base) else base
    by_network = base.set_index("network")
    frame["throughput_speedup"] = [row.samples_per_s / by_network["samples_per_s"].get(row.network, math.nan)
                                   for row in frame.itertuples()]
    frame["time_speedup"] = [by_network["time_to_target_s"].get(row.network, math.nan) / row.time_to_target_s
                             for row in frame.itertuples()]
    order = {network: i for i, network in enumerate(network_order(frame["network"]))}
    labels = {label: i for i, label in enumerate(pd.unique(frame["method_label"]))}
    frame = frame.sort_values(by=["method_label", "network"], key=lambda column: column.map(
        labels if column.name == "method_label" else order), kind="stable")
    return frame.drop(columns="method").reset_index(drop=True)


def plot_network_crossover(speedups: pd.DataFrame, baseline: str = "ddp") -> Figure:
    """network_speedup (method labels · networks x columns) -> three panels against the link rate (slowest left):
    throughput (samples/s of train time), train time to the target, and throughput over the baseline's (where a
    method's line crosses 1 is the crossover: compression pays at the rates left of it)."""
    fig = _figure(15, 4.6)
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
                _note(ax, "no run reached the target")
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
    from harness.network import parse_network

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


def png_bytes(fig: Figure) -> bytes:
    """Render a figure to PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------------ html

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; } .plots figure { margin: 0; }
.plots img { max-width: 100%; width: 760px; border: 1px solid #eee; }
.failure { color: #a00; }
"""


def _mean_ci_text(mean: float, half: float, n: int, digits: str = ".4g") -> str:
    """(0.91234, 0.0123, 2) -> '0.9123 ± 0.0123 (n=2)'; '–' when there is no value."""
    if n == 0 or not math.isfinite(mean):
        return "–"
    text = format(mean, digits)
    if math.isfinite(half):
        text += " ± " + format(half, digits)
    return f"{text} (n={n})"


def aggregate_display(aggregates: pd.DataFrame) -> pd.DataFrame:
    """aggregate (labels x columns) -> the same as text: 'mean ± 95% CI half-width (n=…)' per metric."""
    shown = pd.DataFrame({"label": aggregates["label"], "runs": aggregates["runs"],
                          "completed": aggregates["completed"]})
    for metric, name in AGGREGATED.items():
        shown[name] = [_mean_ci_text(row[f"{metric}_mean"], row[f"{metric}_ci95"], row[f"{metric}_n"])
                       for _, row in aggregates.iterrows()]
    shown["reached target"] = [f"{row['time_to_target_s_n']}/{row['used']}"
                               for _, row in aggregates.iterrows()]
    return shown


def _table_html(frame: pd.DataFrame) -> str:
    """A DataFrame as an HTML table with every cell and header escaped."""
    return frame.to_html(index=False, escape=True, na_rep="", border=0,
                         float_format=lambda value: format(value, ".4g"))


def network_html(speedups: pd.DataFrame, baseline: str = "ddp") -> str:
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
{_table_html(shown)}
"""


def render_html(suite: str, generated: str, table: pd.DataFrame, aggregates: pd.DataFrame,
                failed: pd.DataFrame, images: dict[str, bytes], scope: str, network_section: str = "") -> str:
    """What the page shows -> one self-contained HTML page (inline CSS, images as data: URIs, no links).

    `network_section`: HTML placed after the per-label table (see network_html), for suites over several networks.
    """
    e = html.escape
    figures = "\n".join(
        f'<figure><img alt="{e(name)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        f"<figcaption>{e(name)}</figcaption></figure>"
        for name, png in images.items()
    )
    if failed.empty:
        failures_html = "<p>Every run completed.</p>"
    else:
        items = "\n".join(
            f'<li class="failure"><b>{e(str(row.run_id))}</b> ({e(str(row.label))}): {e(str(row.state))}'
            + ("" if pd.isna(row.rank) else f", rank {e(str(row.rank))}")
            + (f": {e(str(row.message))}" if row.message else "") + "</li>"
            for row in failed.itertuples()
        )
        failures_html = f"<ul>\n{items}\n</ul>"
    completed = int((table["state"] == "completed").sum())
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dtbench report: {e(suite)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>dtbench report: {e(suite)}</h1>
<p class="meta">Generated {e(generated)}. {len(table)} runs, {completed} completed.</p>
<h2>Per label (mean over seeds)</h2>
<p>± is the half-width of the 95% Student-t confidence interval over seeds; n counts the runs with a value.
{e(scope)}</p>
{_table_html(aggregate_display(aggregates))}
{network_section}<h2>Plots</h2>
<p>Bands and error bars are seaborn's 95% bootstrap confidence intervals over seeds.</p>
<div class="plots">
{figures}
</div>
<h2>Runs that did not complete</h2>
{failures_html}
<h2>All runs (summary.csv)</h2>
{_table_html(table)}
</body>
</html>
"""


def write_report(suite_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write summary.csv, the PNG plots and index.html for a suite folder; return the path of index.html.

    Plots: accuracy against train time and epochs, time to target, bytes per sample, (when some run has
    auxiliary heads) per-chunk head accuracy, a Gantt chart of a traced step per pipeline label, and (when the runs
    span more than one network) throughput, time to target and speed-up over ddp against the link rate, with a
    'By network' section on the page.

    out_dir defaults to suite_dir/report. Aggregates, curves and bar plots use the completed runs (every run
    when none completed); the summary table lists every run. Raises ValueError when the folder holds no run.
    """
    suite_dir = Path(suite_dir)
    runs = load_suite(suite_dir)
    if not runs:
        raise ValueError(f"{suite_dir}: no runs found (no */spec.json)")
    out_dir = Path(out_dir) if out_dir is not None else suite_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)

    table = summary(runs)
    table.to_csv(out_dir / "summary.csv", index=False)
    completed = [run for run in runs if run.state == "completed"]
    used = completed or runs
    scope = (f"Aggregates and plots use the {len(completed)} completed runs." if completed
             else "No run completed: aggregates and plots use every run.")
    used_table = table[table["state"] == "completed"] if completed else table
    target = common_target(runs)
    figures = {
        "accuracy_vs_time.png": plot_accuracy(curves(used, "train_time_s"), X_AXES["train_time_s"], target),
        "accuracy_vs_epoch.png": plot_accuracy(curves(used, "epoch"), X_AXES["epoch"], target),
        "time_to_target.png": plot_time_to_target(used_table, target),
        "bytes_per_sample.png": plot_bytes_per_sample(used_table),
    }
    heads = head_accuracies(used)
    if not heads.empty:
        figures["head_accuracy.png"] = plot_head_accuracy(heads)
    figures.update(gantt_figures(used))
    section = ""
    if used_table["network"].nunique() > 1:
        speedups = network_speedup(used_table)
        speedups.to_csv(out_dir / "network_speedup.csv", index=False)
        figures["network_crossover.png"] = plot_network_crossover(speedups)
        section = network_html(speedups)
    images = {}
    for name, fig in figures.items():
        images[name] = png_bytes(fig)
        (out_dir / name).write_bytes(images[name])

    suite = str(runs[0].spec.get("suite") or suite_dir.name)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    page = render_html(suite, generated, table, aggregate(table, ("completed",) if completed else None),
                       failures(runs), images, scope, section)
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
