"""Rankings per workload and network: labels ordered by time to target, speed-up over the baseline, one verdict."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.report import censored, stats
from harness.report.comparisons import with_keys
from harness.report.page import number_text, table_html
from harness.report.paired import paired_interval
from harness.report.tables import not_completed

#: rankings.csv's columns, in order (docs/results.md).
RANKING_COLUMNS = (
    "workload", "network", "target_accuracy", "rank", "label", "method_label", "runs", "completed", "reached",
    "time_to_target_s", "speedup_vs_baseline", "speedup_ci_low", "speedup_ci_high", "speedup_pairs",
    "final_accuracy", "bytes_per_sample", "states", "target_loss", "final_loss", "speedup_bound",
    "speedup_bound_side", "reading", "perplexity", "bytes_per_token", "tokens_per_s", "baseline",
)  # fmt: skip
#: A baseline per workload ({workload: label, or None where nothing compares}), or one label for every workload.
Baselines = Mapping[str, "str | None"] | str


def baseline_of(baseline: Baselines, workload: object) -> str | None:
    """The baseline label of `workload` (None: the workload has none)."""
    return baseline.get(str(workload)) if isinstance(baseline, Mapping) else baseline
#: The per-run columns summary.csv gains (docs/results.md).
SPEEDUP_COLUMNS = ("speedup_vs_baseline", "speedup_ci_low", "speedup_ci_high")


def _mean(values: pd.Series) -> float:
    """The mean of the finite values, NaN when there is none."""
    finite = pd.to_numeric(values, errors="coerce").astype(float)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if len(finite) else math.nan


def speedup(label_runs: pd.DataFrame, baseline_runs: pd.DataFrame) -> tuple[float, float, float, int]:
    """Completed runs of a label and of the baseline in one stratum -> (speed-up, low, high, pairs).

    Runs are paired by seed (the first run of each seed on either side); the speed-up is the baseline's time to
    target over the label's: the geometric mean of the per-seed ratios with its paired 95% t interval
    (harness/report/paired.py, as for claims: a bootstrap of 3 pairs is their min-max). NaN unless both reached
    the target on every pair in a positive time: a missed target has no finite time, and an infinite or zero
    speed-up is not shown.
    """
    mine = label_runs.groupby("seed")["time_to_target_s"].first().astype(float)
    theirs = baseline_runs.groupby("seed")["time_to_target_s"].first().astype(float)
    seeds = [seed for seed in mine.index if seed in theirs.index]
    if not seeds:
        return math.nan, math.nan, math.nan, 0
    a, b = theirs.loc[seeds].to_numpy(), mine.loc[seeds].to_numpy()
    # A target met at the first evaluation takes 0 s: no finite ratio then.
    if not (np.isfinite(a).all() and np.isfinite(b).all() and (a > 0).all() and (b > 0).all()):
        return math.nan, math.nan, math.nan, len(seeds)
    ratio, low, high = paired_interval(a, b, "ratio")
    return ratio, low, high, len(seeds)


def bounded_speedup(label_runs: pd.DataFrame, baseline_runs: pd.DataFrame) -> tuple[float, str]:
    """Completed runs of a label and of the baseline in one stratum -> (bound, side) when a missed target on one
    side leaves only a bound on the speed-up, and that bound decides which is faster (censored.speedup_bound): a
    missed time to target counts as the run's train time, which it is known to exceed. (NaN, '') otherwise."""
    def per_seed(runs: pd.DataFrame) -> pd.DataFrame:
        first = runs.groupby("seed")[["time_to_target_s", "train_time_s"]].first().astype(float)
        missed = ~np.isfinite(first["time_to_target_s"].to_numpy())
        return pd.DataFrame({"time": np.where(missed, first["train_time_s"], first["time_to_target_s"]),
                             "missed": missed}, index=first.index)

    if "train_time_s" not in label_runs or "train_time_s" not in baseline_runs:
        return math.nan, ""
    mine, theirs = per_seed(label_runs), per_seed(baseline_runs)
    seeds = [seed for seed in mine.index if seed in theirs.index]
    if not seeds or mine.loc[seeds, "time"].isna().any() or theirs.loc[seeds, "time"].isna().any():
        return math.nan, ""
    return censored.speedup_bound(mine.loc[seeds, "time"].to_numpy(float), mine.loc[seeds, "missed"].to_numpy(bool),
                                  theirs.loc[seeds, "time"].to_numpy(float),
                                  theirs.loc[seeds, "missed"].to_numpy(bool))


def _order(row: dict[str, Any]) -> tuple:
    """Sort key: reached on every completed run by time, then some by share reached and time, then the rest by
    final accuracy, then labels with no completed run. Without a target, by final accuracy alone."""
    if row["completed"] == 0:
        return (3, 0.0, 0.0)
    timed = not (math.isnan(row["target_accuracy"]) and math.isnan(row["target_loss"]))
    if timed and row["reached"] == row["completed"]:
        return (0, row["time_to_target_s"], 0.0)
    if timed and row["reached"] > 0:
        return (1, -row["reached"] / row["completed"], row["time_to_target_s"])
    if not math.isnan(row["target_loss"]) or row.get("reading") == "loss":  # by held-out loss, lower is better
        loss = row["final_loss"]
        return (2, loss if math.isfinite(loss) else math.inf, 0.0)
    accuracy = row["final_accuracy"]
    return (2, -accuracy if math.isfinite(accuracy) else math.inf, 0.0)


def rankings(table: pd.DataFrame, baseline: Baselines,
             targets: Mapping[str, float | tuple[str, float] | None] | float | None,
             readings: Mapping[str, str] | None = None) -> pd.DataFrame:
    """summary (every run) -> RANKING_COLUMNS, one row per (workload, network, label), ranked within each stratum.

    Statistics use the completed runs: reached counts those that reached the target; time_to_target_s is the mean
    over those; final_accuracy and bytes_per_sample the mean over completed runs. rank starts at 1 per stratum
    (see _order); a label with no completed run keeps a row (rank NaN, `states` says what became of its runs).
    `baseline` is each workload's baseline label without its network (baselines.workload_baselines; None: that
    workload compares nothing), or one label for all; the row's `baseline` column names it. `targets`: each
    workload's target accuracy (None where its runs set none or differ: that stratum ranks by final accuracy), or
    one target for all, or None; a target may be a (kind, value) pair (results.target_of): ("loss", l) is a
    target_loss, whose stratum ranks labels that never reach it by final loss, lowest first. `readings`
    ({workload: 'accuracy' | 'loss'}, tables.readings) says how each workload is read where no target says it: a
    language model without a target ranks by held-out loss. The row's `reading` column records it.
    """
    data = with_keys(table)
    rows = []
    for (workload, network), stratum in data.groupby(["workload", "network"], sort=False):
        done = stratum[stratum["state"] == "completed"]
        base_label = baseline_of(baseline, workload)
        base = done[done["method_label"] == base_label]
        ranked = []
        for label, group in stratum.groupby("label", sort=False):
            mine = done[done["label"] == label]
            times = mine["time_to_target_s"].astype(float)
            bound, side = math.nan, ""
            if len(mine) and mine["method_label"].iloc[0] != base_label and len(base):
                ratio, low, high, pairs = speedup(mine, base)
                if math.isnan(ratio):
                    bound, side = bounded_speedup(mine, base)
            else:
                ratio, low, high, pairs = math.nan, math.nan, math.nan, 0
            target = targets.get(str(workload)) if isinstance(targets, Mapping) else targets
            kind, target = target if isinstance(target, tuple) else ("accuracy", target)
            ranked.append({
                "workload": workload, "network": network,
                "target_accuracy": math.nan if target is None or kind != "accuracy" else float(target),
                "target_loss": float(target) if target is not None and kind == "loss" else math.nan,
                "final_loss": _mean(mine["final_loss"]) if "final_loss" in mine else math.nan, "label": label,
                "method_label": group["method_label"].iloc[0], "runs": len(group), "completed": len(mine),
                "reached": int(np.isfinite(times).sum()), "time_to_target_s": _mean(times),
                "speedup_vs_baseline": ratio, "speedup_ci_low": low, "speedup_ci_high": high, "speedup_pairs": pairs,
                "final_accuracy": _mean(mine["final_accuracy"]), "bytes_per_sample": _mean(mine["bytes_per_sample"]),
                "states": not_completed(group), "speedup_bound": bound, "speedup_bound_side": side,
                "reading": "loss" if kind == "loss" else (readings or {}).get(str(workload), "accuracy"),
                "perplexity": _mean(mine["perplexity"]) if "perplexity" in mine else math.nan,
                "bytes_per_token": _mean(mine["bytes_per_token"]) if "bytes_per_token" in mine else math.nan,
                "tokens_per_s": _mean(mine["tokens_per_s"]) if "tokens_per_s" in mine else math.nan,
                "baseline": base_label or "",
            })  # fmt: skip
        ranked.sort(key=_order)
        for position, row in enumerate(ranked, start=1):
            row["rank"] = position if row["completed"] else None
        rows += ranked
    out = pd.DataFrame(rows, columns=list(RANKING_COLUMNS))
    out["rank"] = out["rank"].astype("Int64")
    return out


def run_speedups(table: pd.DataFrame, ranked: pd.DataFrame, baseline: Baselines) -> pd.DataFrame:
    """summary -> SPEEDUP_COLUMNS per run (same index): the baseline's time to target on the run's seed, workload and
    network over the run's own (NaN when either missed it, either did not complete, or the run is the baseline's),
    and the interval of its label's speed-up (rankings)."""
    data = with_keys(table)
    done = data[data["state"] == "completed"]
    is_base = pd.Series([label == baseline_of(baseline, workload) for label, workload in
                         zip(done["method_label"], done["workload"], strict=True)], index=done.index, dtype=bool)
    base = done[is_base].groupby(["workload", "network", "seed"])["time_to_target_s"].first()
    bounds = ranked.set_index(["workload", "network", "label"])[["speedup_ci_low", "speedup_ci_high"]]
    out = pd.DataFrame(math.nan, index=table.index, columns=list(SPEEDUP_COLUMNS))
    for index, row in data.iterrows():
        if row["state"] != "completed" or row["method_label"] == baseline_of(baseline, row["workload"]):
            continue
        theirs = base.get((row["workload"], row["network"], row["seed"]), math.nan)
        mine = float(row["time_to_target_s"])
        if math.isfinite(theirs) and math.isfinite(mine) and mine > 0:
            out.loc[index, "speedup_vs_baseline"] = theirs / mine
        key = (row["workload"], row["network"], row["label"])
        if key in bounds.index:
            out.loc[index, ["speedup_ci_low", "speedup_ci_high"]] = bounds.loc[key].to_numpy(dtype=float)
    return out


def in_rank_order(frame: pd.DataFrame, ranked: pd.DataFrame) -> pd.DataFrame:
    """Rows with `workload` and `label` (summary runs, or tables.aggregate rows) reordered as the rankings:
    workloads (and networks) in their order, labels by rank; rows of one label keep their order, and their index,
    so that tables, bars and legends read from the fastest down."""
    order = {(str(row.workload), row.label): position for position, row in enumerate(ranked.itertuples())}
    keys = [order.get((str(workload), label), len(order)) for workload, label in
            zip(frame["workload"], frame["label"], strict=True)]
    return frame.iloc[np.argsort(keys, kind="stable")]


def _where(workload: str, network: str) -> str:
    """'digits-mlp' or 'digits-mlp @ 100mbit'."""
    return f"{workload} @ {network}" if network else str(workload)


def _interval(row: pd.Series) -> str:
    """' [low, high]' of a speed-up, '' when it has none."""
    if math.isnan(row["speedup_ci_low"]) or math.isnan(row["speedup_ci_high"]):
        return ""
    return f" [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]"


def stratum_target(stratum: pd.DataFrame) -> float | None:
    """A stratum's target (accuracy, or a language model's loss), None when it has none."""
    target = float(stratum["target_accuracy"].iloc[0])
    if math.isnan(target) and "target_loss" in stratum:
        target = float(stratum["target_loss"].iloc[0])
    return None if math.isnan(target) else target


def _by_loss(stratum: pd.DataFrame) -> bool:
    """Is the stratum read by held-out loss (a target loss, or a language model without a target)?"""
    if "reading" in stratum and stratum["reading"].iloc[0] == "loss":
        return True
    return "target_loss" in stratum and not math.isnan(float(stratum["target_loss"].iloc[0]))


def verdict(stratum: pd.DataFrame, baseline: Baselines) -> str:
    """One stratum's rankings -> the sentence that names its winner (plain text); with a single label, none: there
    is nothing to compare."""
    stratum_baseline = str(stratum["baseline"].iloc[0]) if "baseline" in stratum else None
    baseline = stratum_baseline or baseline_of(baseline, stratum["workload"].iloc[0]) or ""
    target = stratum_target(stratum)
    where = _where(stratum["workload"].iloc[0], stratum["network"].iloc[0])
    done = stratum[stratum["completed"] > 0]
    if done.empty:
        return f"On {where}, no run completed."
    if stratum["label"].nunique() == 1:
        return _alone(stratum, where, target)
    if target is None:
        if _by_loss(stratum):
            best = done.sort_values("final_loss").iloc[0]
            return (f"On {where}, {best['label']} ended with the lowest held-out loss: "
                    f"{number_text(best['final_loss'])}.")
        best = done.sort_values("final_accuracy", ascending=False).iloc[0]
        return f"On {where}, {best['label']} ended most accurate: {number_text(best['final_accuracy'])}."
    reached = done[done["reached"] > 0]
    words = f"target loss {target:g}" if _by_loss(stratum) else f"target {target:g}"
    if reached.empty:
        if _by_loss(stratum):
            best = done.sort_values("final_loss").iloc[0]
            return (f"On {where}, no label reached the {words}; {best['label']} ended with the lowest held-out "
                    f"loss ({number_text(best['final_loss'])}).")
        best = done.sort_values("final_accuracy", ascending=False).iloc[0]
        return (f"On {where}, no label reached the {words}; {best['label']} ended most accurate "
                f"({number_text(best['final_accuracy'])}).")
    top = done.iloc[0]
    if top["reached"] < top["completed"]:
        return (f"On {where}, no label reached the {words} on every completed run; {top['label']} came "
                f"closest ({top['reached']} of {top['completed']}, in {number_text(top['time_to_target_s'])} s).")
    text = (f"On {where}, {top['label']} reached the {words} fastest, in "
            f"{number_text(top['time_to_target_s'])} s (mean of {top['reached']} runs)")
    base = stratum[stratum["method_label"] == baseline]
    if top["method_label"] == baseline:
        return text + ": it is the baseline."
    if math.isfinite(top["speedup_vs_baseline"]):
        return text + f": {top['speedup_vs_baseline']:.2f}x{_interval(top)} the speed of the baseline {baseline}."
    if top.get("speedup_bound_side") == ">=":
        return text + (f": at least {top['speedup_bound']:.2f}x the speed of the baseline {baseline}, which missed "
                       "the target on some runs (their time counted as their train time, which it exceeds).")
    if base.empty:
        return text + f"; the baseline {baseline} did not run here, so no speed-up is given."
    if base["completed"].iloc[0] == 0:
        return text + f"; the baseline {baseline} has no completed run here, so no speed-up is given."
    if base["reached"].iloc[0] < base["completed"].iloc[0]:
        return text + f"; the baseline {baseline} missed the target on some runs, so no speed-up is given."
    return text + f"; it shares no seed with the baseline {baseline}, so no speed-up is given."


def _alone(stratum: pd.DataFrame, where: str, target: float | None) -> str:
    """The verdict of a stratum where one label ran: nothing to compare, and what it reached."""
    row = stratum.iloc[0]
    text = f"On {where}, only {row['label']} ran: nothing to compare"
    by_loss = _by_loss(stratum)
    ended = (f"held-out loss {number_text(row['final_loss'])}" if by_loss
             else f"accuracy {number_text(row['final_accuracy'])}")
    if target is None:
        return f"{text}; it ended at {ended}."
    words = f"target loss {target:g}" if by_loss else f"target {target:g}"
    if row["reached"] == row["completed"]:
        return f"{text}; it reached the {words} in {number_text(row['time_to_target_s'])} s."
    return f"{text}; it reached the {words} on {row['reached']} of {row['completed']} runs, ending at {ended}."


def _speedup_text(row: pd.Series, baseline: str) -> str:
    """A ranking row's speed-up cell (`baseline`: its stratum's)."""
    if row["method_label"] == baseline:
        return "baseline"
    if math.isfinite(row["speedup_vs_baseline"]):
        return f"{row['speedup_vs_baseline']:.2f}x{_interval(row)}"
    side = row.get("speedup_bound_side", "")
    if side:  # a missed target on one side leaves a bound that still says which is faster
        return f"{'≥' if side == '>=' else '≤'} {row['speedup_bound']:.2f}x"
    return "–"


def _time_text(row: pd.Series) -> str:
    """A ranking row's time-to-target cell: the mean over the runs that reached it, and how many did."""
    if row["completed"] == 0:
        return f"– (0 of {row['runs']} completed: {row['states']})"
    if row["reached"] == 0:
        return f"not reached (0 of {row['completed']})"
    time = number_text(row["time_to_target_s"])
    return time if row["reached"] == row["completed"] else f"{time} ({row['reached']} of {row['completed']})"


def rankings_html(ranked: pd.DataFrame, baseline: Baselines, interval: str = stats.CI_WORDS) -> str:
    """The 'Rankings' section: per workload and network, the verdict sentence and the ranked labels; with fewer than
    3 runs a label (`interval`, stats.interval_words, is not a CI), a sentence that the order is not significant."""
    e = html.escape
    parts = ['<section id="rankings">\n<h2>Rankings</h2>\n',
             "<p>Per workload and network, the labels ordered by time to target (the mean over the completed runs "
             "that reached it; labels that reached it on every run first, then those that reached it on some, by "
             "the share), then by final accuracy. Speed-up: the workload's baseline's time to target over the "
             "label's, the geometric mean of the per-seed ratios with its paired t interval; given only when both "
             "reached the "
             "target on every shared seed, or, where one side missed it on some seed, the bound (≥ or ≤) that the "
             "missed run's train time gives, when that bound says which is faster. A workload whose runs set no "
             "target (or different ones) ranks by final accuracy (a language model by its held-out loss, lowest "
             "first), with no time to target and no speed-up. A language model's table leads with held-out loss "
             "and perplexity, and has no accuracy column. Each workload has its own baseline, named in its "
             "speed-up column (the suite's for that workload, else its first ddp run); a workload with one label "
             "has nothing to compare, and names no winner.</p>\n"]
    if interval != stats.CI_WORDS:
        parts.append(f'<p class="warning"><b>Not significant.</b> Some labels have fewer than '
                     f"{stats.MIN_INTERVAL_RUNS} runs ({e(interval)}): the order below is what these runs gave, not "
                     f"a finding, and labels whose ranges overlap may swap places in another run of the suite.</p>\n")
    for _, stratum in ranked.groupby(["workload", "network"], sort=False):
        base = str(stratum["baseline"].iloc[0]) if "baseline" in stratum else \
            baseline_of(baseline, stratum["workload"].iloc[0]) or ""
        target = stratum_target(stratum)
        shown = pd.DataFrame({
            "rank": ["–" if pd.isna(r) else str(int(r)) for r in stratum["rank"]],
            "label": stratum["label"],
            "time to target (s)": [_time_text(row) for _, row in stratum.iterrows()],
            f"speed-up vs {base}": [_speedup_text(row, base) for _, row in stratum.iterrows()],
        })  # fmt: skip
        if _by_loss(stratum):  # a language model: held-out loss and perplexity lead; no accuracy column
            shown["held-out loss"] = [number_text(v) for v in stratum["final_loss"]]
            shown["perplexity"] = [number_text(v) for v in stratum["perplexity"]]
            shown["bytes / token"] = [number_text(v, ",.1f") for v in stratum["bytes_per_token"]]
            shown["tokens / s"] = [number_text(v, ",.0f") for v in stratum["tokens_per_s"]]
        else:
            shown["final accuracy"] = [number_text(v) for v in stratum["final_accuracy"]]
            shown["bytes / sample"] = [number_text(v, ",.0f") for v in stratum["bytes_per_sample"]]
        if target is None:  # no target: nothing was timed, the order is by final accuracy
            shown = shown.drop(columns=["time to target (s)", f"speed-up vs {base}"])
        elif not base:  # one label: nothing to compare, no speed-up column
            shown = shown.drop(columns=[f"speed-up vs {base}"])
        where = _where(stratum["workload"].iloc[0], stratum["network"].iloc[0])
        parts += [f"<h3>{e(where)}</h3>\n", f'<p class="verdict">{e(verdict(stratum, baseline))}</p>\n',
                  table_html(shown)]
    parts.append("</section>\n")
    return "".join(parts)
