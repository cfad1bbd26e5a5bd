"""Tables over a suite's runs: one summary row per run, aggregates per label over seeds, curves, and failures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from harness.bytesize import format_bytes
from harness.report import figures, hygiene, stats
from harness.report.pipeline import measured_bubble
from harness.results import RunResult, reached_target, target_of

#: The summary.csv contract, in order (docs/results.md); EXTRA_COLUMNS follow.
SUMMARY_COLUMNS = (
    "suite", "run_id", "method", "workload", "world_size", "seed", "state", "final_accuracy", "best_accuracy",
    "time_to_target_s", "train_time_s", "total_bytes", "bytes_per_sample",
)  # fmt: skip
EXTRA_COLUMNS = ("label", "family", "steps", "epochs", "network", "samples_per_s", "bubble", "peak_activation_bytes",
                 "peak_weight_bytes")
#: Further columns (after EXTRA_COLUMNS): steady-state communication and measurement hygiene (report/hygiene.py).
MORE_COLUMNS = ("last_epoch_bytes_per_sample", "cpu_share", "other_load", "noisy", "peak_rss_bytes", "final_loss",
                "perplexity", "bytes_per_token", "tokens_per_s", "memory_per_rank", "planned_memory_bytes",
                "held_memory_bytes", "allocator_peak_bytes")
CURVE_COLUMNS = ("label", "seed", "run_id", "x", "test_accuracy")
#: Summary columns that the per-label aggregate averages over seeds, with their display names.
AGGREGATED = {
    "final_accuracy": "final accuracy",
    "time_to_target_s": "time to target (s)",
    "train_time_s": "train time (s)",
    "bytes_per_sample": "bytes / sample",
    "final_loss": "held-out loss",
    "perplexity": "perplexity",
    "bytes_per_token": "bytes / token",
    "tokens_per_s": "tokens / s",
}
#: The AGGREGATED metrics a workload's per-label table shows, by how the workload is read (reading_of).
SHOWN = {"accuracy": ("final_accuracy", "time_to_target_s", "train_time_s", "bytes_per_sample"),
         "loss": ("final_loss", "perplexity", "time_to_target_s", "train_time_s", "bytes_per_token", "tokens_per_s")}
X_AXES = {"train_time_s": "train time (s)", "epoch": "epoch", "step": "step",
          "tokens": "tokens trained on (samples x context)"}
#: The record kinds the report reads (docs/results.md); records of other kinds are ignored.
KNOWN_KINDS = ("train", "eval", "comm", "cpu")


def numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """frame[column] as floats (NaN where missing or not a number); all NaN when the column is absent."""
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)

def lowest_rank(records: pd.DataFrame) -> pd.DataFrame:
    """The records of the lowest rank present (rank 0 in a healthy run); all of them when none has a rank."""
    ranks = numeric(records, "rank")
    return records[ranks == ranks.min()] if ranks.notna().any() else records

def eval_records(metrics: pd.DataFrame) -> pd.DataFrame:
    """metrics (records x fields) -> the `eval` records of the lowest rank that wrote any (rank 0)."""
    return lowest_rank(metrics[metrics["kind"] == "eval"])

def last_value(values: pd.Series) -> float:
    """The last non-NaN value, or NaN."""
    values = values.dropna()
    return float(values.iloc[-1]) if len(values) else math.nan

def run_summary(run: RunResult) -> dict[str, Any]:
    """One run -> one summary row (a dict keyed by SUMMARY_COLUMNS + EXTRA_COLUMNS); see `summary`."""
    spec, metrics = run.spec, run.metrics
    evals = eval_records(metrics)
    accuracy = numeric(evals, "test_accuracy")
    loss = numeric(evals, "test_loss")
    reached = reached_target(evals, spec)
    time_to_target = float(numeric(evals, "train_time_s")[reached].iloc[0]) if reached.any() else math.nan

    rank0 = lowest_rank(metrics[metrics["kind"].isin(KNOWN_KINDS)])
    train = metrics[metrics["kind"] == "train"]
    sent = numeric(train, "bytes_sent")
    has_bytes = sent.notna() & numeric(train, "rank").notna()
    sent_total = float(sent[has_bytes].groupby(numeric(train, "rank")[has_bytes]).last().sum())  # inf past 1.8e308
    total_bytes = int(round(sent_total)) if abs(sent_total) < 2**63 else None  # beyond a byte counter: a blank
    samples = last_value(numeric(lowest_rank(train), "samples"))
    train_time = float(numeric(rank0[rank0["kind"] != "cpu"], "train_time_s").max())
    return {
        "suite": spec.get("suite"),
        "run_id": spec.get("run_id") or run.run_dir.name,
        "method": spec.get("method"),
        "workload": spec.get("workload"),
        "world_size": spec.get("world_size"),
        "seed": spec.get("seed"),
        "state": run.state,
        "final_accuracy": last_value(accuracy),
        "best_accuracy": float(accuracy.max()) if accuracy.notna().any() else math.nan,
        "time_to_target_s": time_to_target,
        "train_time_s": train_time,
        "total_bytes": total_bytes,
        "bytes_per_sample": sent_total / samples if samples > 0 else math.nan,
        "label": run.label,
        "family": spec.get("family"),
        "steps": numeric(rank0, "step").max(),
        "epochs": float(numeric(rank0, "epoch").max()),
        "network": network_text(spec),
        "samples_per_s": samples / train_time if samples > 0 and train_time > 0 else math.nan,
        "bubble": measured_bubble(run),
        "peak_activation_bytes": peak_bytes(train, "peak_activation_bytes"),
        "peak_weight_bytes": peak_bytes(train, "peak_weight_bytes"),
        "last_epoch_bytes_per_sample": last_epoch_bytes_per_sample(train),
        **hygiene.run_hygiene(metrics),
        "peak_rss_bytes": float(numeric(metrics[metrics["kind"] == "cpu"], "peak_rss_bytes").max()),
        "final_loss": last_value(loss),
        "perplexity": perplexity(last_value(loss)),
        "bytes_per_token": bytes_per_token(spec, sent_total / samples if samples > 0 else math.nan),
        "tokens_per_s": tokens_per(spec, samples / train_time if samples > 0 and train_time > 0 else math.nan),
        **memory_columns(run),
    }


def perplexity(loss: float) -> float:
    """exp(loss) of a mean per-token loss in nats: inf where it overflows a float (a diverged run's loss above
    709.78, or inf), NaN for a NaN or negative-infinite loss."""
    if math.isnan(loss) or loss == -math.inf:
        return math.nan
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def memory_columns(run: RunResult) -> dict[str, float]:
    """memory_per_rank (the run's emulated device memory), planned_memory_bytes and held_memory_bytes (the largest
    rank's planned and measured bytes) and allocator_peak_bytes (the largest rank's allocator peak over its
    measured steps, harness/memory/peak.py), from status.json's final; NaN where a run has none."""
    final = (run.status or {}).get("final") or {}
    budget = (run.spec or {}).get("memory_per_rank")
    out = {}
    for key, value in (("memory_per_rank", budget), ("planned_memory_bytes", final.get("planned_memory_bytes")),
                       ("held_memory_bytes", final.get("held_memory_bytes")),
                       ("allocator_peak_bytes", final.get("allocator_peak_bytes"))):
        out[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    return out


def state_text(state: str, planned: float, budget: float) -> str:
    """A run's state as the page says it: 'does not fit (needs 61.2 MB > 48.0 MB)' for a run its memory_per_rank
    refused, else the state."""
    if state != "does_not_fit":
        return state
    if math.isfinite(planned) and math.isfinite(budget):
        return f"does not fit (needs {format_bytes(planned)} > {format_bytes(budget)})"
    return "does not fit"


def context_of(spec: dict[str, Any]) -> int | None:
    """A language model's tokens per sample (workload_options.context), None for other workloads."""
    context = (spec.get("workload_options") or {}).get("context")
    return context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None


def bytes_per_token(spec: dict[str, Any], per_sample: float) -> float:
    """bytes_per_sample over a language model's tokens per sample (workload_options.context); NaN for others."""
    context = context_of(spec)
    return per_sample / context if context else math.nan


def tokens_per(spec: dict[str, Any], per_sample: float) -> float:
    """A count per sample (samples/s) as a count of tokens (tokens/s) for a language model; NaN for others."""
    context = context_of(spec)
    return per_sample * context if context else math.nan


def reading_of(runs: Sequence[RunResult]) -> str:
    """How a workload's runs are read: 'loss' (held-out loss and perplexity lead, no accuracy) when their budget
    targets a loss, or when they target nothing and are language models (per-token); 'accuracy' otherwise. A
    workload whose budget targets an accuracy is read by it, whatever else it records."""
    kinds = {kind for kind, _ in filter(None, (target_of(run.spec) for run in runs))}
    if kinds:
        return "loss" if kinds == {"loss"} else "accuracy"
    return "loss" if runs and all(context_of(run.spec) for run in runs) else "accuracy"


def readings(runs: Sequence[RunResult]) -> dict[str, str]:
    """{workload: reading_of(its runs)}."""
    by_workload: dict[str, list[RunResult]] = {}
    for run in runs:
        by_workload.setdefault(str(run.spec.get("workload")), []).append(run)
    return {workload: reading_of(members) for workload, members in by_workload.items()}

def peak_bytes(train: pd.DataFrame, column: str) -> float:
    """The largest value over every train record (all ranks) of a per-stage list field such as
    peak_activation_bytes: the most any stage held in any step. NaN when no record has the field (not a pipeline)."""
    if column not in train.columns:
        return math.nan
    values = [v for cell in train[column] if isinstance(cell, list) for v in cell if isinstance(v, (int, float))]
    return float(max(values)) if values else math.nan

def last_epoch_bytes_per_sample(train: pd.DataFrame) -> float:
    """train records (records x fields) -> bytes sent by all ranks per sample over the last epoch of training: the
    steady state, after any warm-up. For each rank, bytes_sent of its last record minus that of its last record at
    least one epoch earlier (0 bytes at epoch 0 when there is none), summed over ranks, over the samples between
    rank 0's two records. NaN without train records with bytes and samples."""
    epochs, sent, samples = numeric(train, "epoch"), numeric(train, "bytes_sent"), numeric(train, "samples")
    ranks = numeric(train, "rank")
    keep = epochs.notna() & sent.notna() & samples.notna() & ranks.notna()
    if not keep.any():
        return math.nan
    frame = pd.DataFrame({"rank": ranks[keep], "epoch": epochs[keep], "sent": sent[keep], "samples": samples[keep]})
    total, span = 0.0, math.nan
    for rank, rows in frame.groupby("rank"):
        last = rows.iloc[-1]
        earlier = rows[rows["epoch"] <= last["epoch"] - 1.0]
        before = earlier.iloc[-1] if len(earlier) else pd.Series({"sent": 0.0, "samples": 0.0})
        total += last["sent"] - before["sent"]
        if rank == frame["rank"].min():
            span = last["samples"] - before["samples"]
    return total / span if span > 0 else math.nan

def network_text(spec: dict[str, Any]) -> str:
    """A spec's emulated network in the --network form ('100mbit,latency=1ms'); '' for none (loopback)."""
    network = spec.get("network")
    if not isinstance(network, dict):
        return ""
    return str(network.get("rate") or "unlimited") + (f",latency={network['latency']}" if network.get("latency")
                                                      else "")

@stats.extreme_values_shown
def summary(runs: Sequence[RunResult]) -> pd.DataFrame:
    """runs -> DataFrame (runs x SUMMARY_COLUMNS + EXTRA_COLUMNS), one row per run in the given order.

    - final_accuracy / best_accuracy: test_accuracy of the last `eval` record / the best one (NaN if none).
    - time_to_target_s: train_time_s of the first eval record with test_accuracy >=
      spec["budget"]["target_accuracy"] (or with test_loss <= its target_loss, for a language model); NaN (an
      empty cell in summary.csv) if never reached or no target.
    - train_time_s: the largest train_time_s of rank 0's records of KNOWN_KINDS (other kinds are ignored).
    - total_bytes: sum over ranks of the bytes_sent of each rank's last train record that has one (else 0); empty
      (pandas' NA) when the sum is beyond a byte counter's 2**63 (corrupt records: the other columns say inf).
    - bytes_per_sample: total_bytes / the (global) samples of rank 0's last train record; NaN if 0 or missing.
    - state: status.json's state, "unknown" when it is missing.
    - steps / epochs: the largest step / epoch of rank 0's records of KNOWN_KINDS.
    - network: the emulated network in the --network form ('100mbit', 'unlimited,latency=1ms'); empty for none.
    - samples_per_s: throughput, rank 0's last global samples / train_time_s (NaN when either is 0 or missing).
    - bubble: a multi-process pipeline run's measured idle share, from its `trace` records (NaN for others).
    - peak_activation_bytes / peak_weight_bytes: a pipeline run's most bytes of stored activations / of stashed or
      predicted weight versions held by any stage in any step (max over stages; NaN for other methods).
    - last_epoch_bytes_per_sample: bytes_per_sample over the last epoch only (see last_epoch_bytes_per_sample).
    - cpu_share, other_load, noisy: measurement hygiene from the ranks' `cpu` records (report/hygiene.py): the
      lowest share of its runnable time a rank ran, the largest share of a host used by other processes, and
      whether the run was starved by them (empty for runs without `cpu` records).
    - peak_rss_bytes: the largest peak resident memory of any rank (`cpu` records; empty without the field).
    - final_loss / perplexity: test_loss of the last eval record (per token for a language model) and exp of it
      (inf where that overflows: a diverged run's loss above 709.78).
    - bytes_per_token: bytes_per_sample / workload_options.context (a language model's tokens per window).
    - tokens_per_s: samples_per_s x workload_options.context (a language model's throughput in tokens).
    - memory_per_rank: the run's emulated device memory (bytes; NaN without one); planned_memory_bytes and
      held_memory_bytes: its largest rank's planned bytes (before the first step) and measured held bytes
      (harness/memory/kinds.py's kinds, each at its peak); allocator_peak_bytes: its largest rank's allocator peak
      (harness/memory/peak.py, the plan's ground truth). A run refused by memory_per_rank has state does_not_fit.
    A run without metrics still gets a row (NaN metrics, 0 bytes).
    """
    rows = [run_summary(run) for run in runs]
    table = pd.DataFrame(rows, columns=[*SUMMARY_COLUMNS, *EXTRA_COLUMNS, *MORE_COLUMNS])
    totals = [row["total_bytes"] for row in rows]  # ints, or None beyond 2**63 (a blank; NaN would round them)
    table["total_bytes"] = pd.array(totals, dtype="Int64" if None in totals else "int64")
    table["steps"] = table["steps"].astype("Float64").round().astype("Int64")
    table["noisy"] = table["noisy"].astype("boolean")
    return table

def not_completed(runs: pd.DataFrame) -> str:
    """The states of the summary rows that did not complete, counted in order of appearance: 'diverged 2',
    'failed 1, diverged 1'; '' when every run completed."""
    rows = runs[runs["state"] != "completed"]
    missing = pd.Series([state_text(str(r["state"]), float(r.get("planned_memory_bytes", math.nan)),
                                    float(r.get("memory_per_rank", math.nan))) for _, r in rows.iterrows()],
                        dtype=object)
    return ", ".join(f"{state} {count}" for state, count in missing.value_counts(sort=False).items())

def aggregate(table: pd.DataFrame, states: Sequence[str] | None = ("completed",)) -> pd.DataFrame:
    """summary (runs x columns) -> DataFrame ((workload, label) x columns), in order of first appearance: a label
    that runs on several workloads gets one row per workload, so that no mean mixes workloads.

    Columns: workload, label, family, runs (all the label's runs), completed, used (runs whose state is in `states`,
    or all runs when states is None: only these enter the statistics), noisy (used runs starved of CPU),
    not_completed (the other runs' states counted: 'diverged 2'; '' when all completed), then for each
    AGGREGATED metric m: m_mean, m_ci_low and m_ci_high (the 95% percentile bootstrap interval of the mean over
    seeds, stats.bootstrap_ci95: the interval the plots draw) and m_n (used runs with a finite value; for
    time_to_target_s, those that reached the target).
    """
    rows = []
    for (workload, label), group in table.groupby(["workload", "label"], sort=False, dropna=False):
        used = group if states is None else group[group["state"].isin(states)]
        row: dict[str, Any] = {
            "workload": workload,
            "label": label,
            "family": group["family"].iloc[0] if "family" in group.columns else None,
            "runs": len(group),
            "completed": int((group["state"] == "completed").sum()),
            "used": len(used),
            "noisy": len(hygiene.noisy_runs(used)),
            "not_completed": not_completed(group),
        }
        for metric in AGGREGATED:
            values = numeric(used, metric)
            finite = values[np.isfinite(values)]
            row[f"{metric}_mean"] = float(finite.mean()) if len(finite) else math.nan
            row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = stats.bootstrap_ci95(finite)
            row[f"{metric}_n"] = len(finite)
        rows.append(row)
    columns = ["workload", "label", "family", "runs", "completed", "used", "noisy", "not_completed"]
    columns += [f"{m}_{s}" for m in AGGREGATED for s in ("mean", "ci_low", "ci_high", "n")]
    return pd.DataFrame(rows, columns=columns)

def run_series(run: RunResult, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    """One run's (x, y) points, sorted by x: test_accuracy from its rank-0 eval records, or the training `loss` of
    its train records from the lowest rank that logged one (a pipeline's last stage computes the loss). Points
    that a plot cannot show (figures.plottable) are left out."""
    if y == "loss":
        train = run.metrics[run.metrics["kind"] == "train"]
        train = train[numeric(train, "loss").notna()]
        records = lowest_rank(train)
    else:
        records = eval_records(run.metrics)
    if x == "tokens":  # a language model's samples are windows of `context` tokens
        xs = numeric(records, "samples").to_numpy() * (context_of(run.spec) or math.nan)
    else:
        xs = numeric(records, x).to_numpy()
    ys = numeric(records, y).to_numpy()
    keep = figures.plottable(xs) & figures.plottable(ys)  # finite, and an axis can be drawn around it
    order = np.argsort(xs[keep], kind="stable")
    return xs[keep][order], ys[keep][order]

def curves(runs: Sequence[RunResult], x: str = "train_time_s", grid_points: int = 100,
           y: str = "test_accuracy") -> pd.DataFrame:
    """runs -> DataFrame (runs·grid_points x CURVE_COLUMNS + workload): each run's y on its label's grid.

    y: "test_accuracy" or "test_loss" (rank-0 eval records) or "loss" (train records, run_series); the column keeps
    y's name. x: a key of X_AXES ("tokens": samples x workload_options.context, for language models).
    Each run's points are interpolated with np.interp onto one grid per (workload, label): grid_points evenly spaced
    values from 0 to the *smallest* final x among that label's runs, so that every seed covers the whole grid and
    seaborn aggregates the same seeds at identical x (longer seeds are cut there). The runner evaluates before the
    first step, so every run starts at x = 0; for runs that do not, the grid starts at the latest first point
    among the label's runs instead, and where they do not overlap at all a run is NaN before its first point:
    nothing is extrapolated. Runs without points are left out and do not shorten their label's grid.
    """
    if x not in X_AXES:
        raise ValueError(f"curves: x must be one of {sorted(X_AXES)}, not {x!r}")
    if grid_points < 2:
        raise ValueError(f"curves: grid_points must be at least 2, not {grid_points}")
    by_label: dict[tuple[str, str], list[tuple[RunResult, np.ndarray, np.ndarray]]] = {}
    for run in runs:
        xs, ys = run_series(run, x, y)
        if len(xs):
            by_label.setdefault((str(run.spec.get("workload")), run.label), []).append((run, xs, ys))
    frames = []
    for (workload, label), members in by_label.items():
        start, end = max(xs[0] for _, xs, _ in members), min(xs[-1] for _, xs, _ in members)
        grid = np.linspace(start if 0 < start <= end else 0.0, end, grid_points)
        for run, xs, ys in members:
            frames.append(pd.DataFrame({
                "label": label,
                "seed": run.spec.get("seed"),
                "run_id": run.spec.get("run_id") or run.run_dir.name,
                "x": grid,
                y: np.interp(grid, xs, ys, left=np.nan),
                "workload": workload,
            }))  # fmt: skip
    if not frames:
        return pd.DataFrame(columns=[*CURVE_COLUMNS[:4], y, "workload"])
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
        memory = memory_columns(run)
        state = state_text(run.state, memory["planned_memory_bytes"], memory["memory_per_rank"])
        rows.append({"run_id": run_id, "label": run.label, "state": state, "rank": rank,
                     "message": message})
    return pd.DataFrame(rows, columns=["run_id", "label", "state", "rank", "message"])

def common_target(runs: Sequence[RunResult]) -> float | None:
    """The target accuracy shared by every run's budget, or None when they set none or differ."""
    targets = {(run.spec.get("budget") or {}).get("target_accuracy") for run in runs}
    return targets.pop() if len(targets) == 1 else None


def common_target_of(runs: Sequence[RunResult]) -> tuple[str, float] | None:
    """The target (target_of) shared by every run, or None when they set none or differ."""
    targets = {target_of(run.spec) for run in runs}
    return targets.pop() if len(targets) == 1 else None
