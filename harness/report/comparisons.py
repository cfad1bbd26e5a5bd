"""Robust comparisons within each workload: IQM with stratified bootstrap intervals, probability of improvement over
the workload's baseline, the MLPerf result, labels identical on every seed, and AlgoPerf performance profiles and score
(normalised per problem), as tables and an HTML section."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.report import performance_profiles, stats
from harness.report.network import method_label
from harness.report.page import interval_text, number_text, table_html

#: The metrics compared, each with its display name and whether higher is better. A workload read by accuracy has
#: no held-out loss here, and a language model (read by its loss, tables.readings) no accuracy.
METRICS = {"final_accuracy": ("final accuracy", True), "final_loss": ("held-out loss", False),
           "time_to_target_s": ("time to target", False)}
#: The final-quality metric of each reading; the other's values are left out of its workloads' rows.
QUALITY = {"accuracy": "final_accuracy", "loss": "final_loss"}


def with_keys(table: pd.DataFrame) -> pd.DataFrame:
    """summary (runs x columns) -> the same with `method_label` (the label without its network) and `stratum`
    ((workload, network): runs that are comparable), and time_to_target_s as +inf where the target was missed."""
    networks = table["network"].fillna("").astype(str) if "network" in table.columns else pd.Series(
        "", index=table.index)
    out = table.assign(network=networks)
    out["method_label"] = [method_label(str(label), net) for label, net in zip(out["label"], networks, strict=True)]
    out["stratum"] = list(zip(out["workload"].astype(str), networks, strict=True))
    times = pd.to_numeric(out["time_to_target_s"], errors="coerce").astype(float)
    out["time_to_target_s"] = times.where(times.notna(), math.inf)
    return out


def _by_stratum(rows: pd.DataFrame, metric: str, sign: float) -> dict[Any, np.ndarray]:
    """rows -> {stratum: 1-D array of sign · metric} (NaN dropped later by the statistics)."""
    return {key: sign * pd.to_numeric(group[metric], errors="coerce").to_numpy(dtype=float)
            for key, group in rows.groupby("stratum", sort=False)}


def read_by(table: pd.DataFrame, readings: Mapping[str, str] | None) -> pd.DataFrame:
    """table with each run's final quality only in its reading's column (QUALITY): a language model's final_accuracy
    and an image classifier's final_loss become NaN, so neither is compared as the other's quality."""
    reading_of = dict(readings or {})
    kinds = table["workload"].astype(str).map(lambda workload: reading_of.get(workload, "accuracy"))
    out = table.copy()
    for reading, metric in QUALITY.items():
        if metric not in out.columns:
            out[metric] = math.nan
        out[metric] = pd.to_numeric(out[metric], errors="coerce").astype(float).where(kinds == reading)
    return out


def robust_table(table: pd.DataFrame, baseline: str | Mapping[str, str | None],
                 has_target: bool = True, readings: Mapping[str, str] | None = None) -> pd.DataFrame:
    """summary (runs x columns) -> one row per workload and label (workloads in order of first appearance, then
    their labels): workload, label, runs, then for each METRICS m: iqm_m, iqm_m_low, iqm_m_high (rliable's IQM over
    the label's runs on the workload with the stratified bootstrap interval, strata = networks), poi_m, poi_m_low,
    poi_m_high (probability that a run of the label beats a run of `baseline`, a label without its network, or each
    workload's ({workload: label or None}), in the same stratum; 'beats' is a higher accuracy, a shorter time; NaN on
    the baseline itself), and mlperf_time_to_target_s (the olympic mean over seeds when the runs share one network).
    Nothing is averaged across workloads: a label that ran on three workloads has three rows.

    A missed target counts as an infinite time: it ranks slowest in the probability of improvement, and an IQM or
    interval end that it reaches is NaN (censored: not a number). Without a target (`has_target` False) the time
    columns are NaN. `readings` ({workload: 'accuracy' | 'loss'}, tables.readings) says which final quality each
    workload's runs are compared by (read_by); a workload it does not name is read by accuracy.
    """
    data = with_keys(read_by(table, readings))
    def base_of(workload: object) -> str | None:
        return baseline.get(str(workload)) if isinstance(baseline, Mapping) else baseline

    is_base = pd.Series([label == base_of(workload) for label, workload in
                         zip(data["method_label"], data["workload"], strict=True)], index=data.index)
    rows = []
    workload_order = {w: k for k, w in enumerate(pd.unique(data["workload"].astype(str)))}
    groups = sorted(data.groupby([data["workload"].astype(str), "label"], sort=False),
                    key=lambda item: workload_order[item[0][0]])  # stable: labels keep their order in a workload
    for (workload, label), group in groups:
        mine = group["method_label"].iloc[0]
        row: dict[str, Any] = {"label": label, "method_label": mine, "runs": len(group), "workload": workload}
        for metric, (_, higher) in METRICS.items():
            if metric == "time_to_target_s" and not has_target:
                row.update({f"{k}_{metric}{s}": math.nan for k in ("iqm", "poi") for s in ("", "_low", "_high")})
                continue
            sign = 1.0 if higher else -1.0
            ours = _by_stratum(group, metric, 1.0)
            # A missed target is an infinite time here; an IQM (or an interval end) that one reaches is censored,
            # not a number: NaN, shown as '–'.
            row[f"iqm_{metric}"], row[f"iqm_{metric}_low"], row[f"iqm_{metric}_high"] = (
                v if math.isfinite(v) else math.nan for v in stats.stratified_bootstrap_ci(list(ours.values())))
            theirs = _by_stratum(data[is_base], metric, sign)
            shared = [key for key in ours if key in theirs]
            if is_base[group.index].all() or not shared:
                poi = (math.nan, math.nan, math.nan)
            else:
                poi = stats.probability_of_improvement([sign * ours[k] for k in shared], [theirs[k] for k in shared])
            row[f"poi_{metric}"], row[f"poi_{metric}_low"], row[f"poi_{metric}_high"] = poi
        single = group["stratum"].nunique() == 1
        row["mlperf_time_to_target_s"] = (performance_profiles.olympic_mean(group["time_to_target_s"])
                                          if single and has_target else math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def improvement_long(robust: pd.DataFrame) -> pd.DataFrame:
    """robust_table -> rows (workload, label, metric, poi, poi_low, poi_high) for plot_improvement, the rows with a
    value."""
    rows = []
    for _, row in robust.iterrows():
        for metric, (name, _) in METRICS.items():
            if np.isfinite(row[f"poi_{metric}"]):
                rows.append({"workload": row["workload"], "label": row["label"], "metric": name,
                             "poi": row[f"poi_{metric}"], "poi_low": row[f"poi_{metric}_low"],
                             "poi_high": row[f"poi_{metric}_high"]})
    return pd.DataFrame(rows, columns=["workload", "label", "metric", "poi", "poi_low", "poi_high"])


#: Two labels' final metrics are one value when they differ by at most this, relative.
IDENTICAL = 1e-6
#: The final metrics compared for identity, with their names on the page.
IDENTITY_METRICS = {"final_accuracy": "accuracy", "final_loss": "held-out loss"}


def identical_labels(table: pd.DataFrame) -> dict[str, list[tuple[list[str], int]]]:
    """summary (the runs compared) -> {workload: [(labels, seeds)]}: groups of two or more labels of a workload
    whose runs have the same seeds and, on every seed, the same final accuracy and held-out loss to within IDENTICAL
    relative (numpy.isclose, rtol=IDENTICAL, atol=0; a value missing on both sides matches). Such labels follow one
    training trajectory (the same updates computed in another schedule or placement), so only their times differ.
    A label with no finite final metric, or with two runs of one seed, is never grouped. Labels keep their order."""
    metrics = [m for m in IDENTITY_METRICS if m in table.columns]
    out: dict[str, list[tuple[list[str], int]]] = {}
    if not metrics or table.empty:
        return out
    for workload, runs in table.groupby(table["workload"].astype(str), sort=False):
        signatures: list[tuple[str, tuple, np.ndarray]] = []
        for label, group in runs.groupby(runs["label"].astype(str), sort=False):
            if group["seed"].duplicated().any():
                continue
            group = group.sort_values("seed")
            values = np.column_stack([pd.to_numeric(group[m], errors="coerce").to_numpy(dtype=float)
                                      for m in metrics])
            if np.isfinite(values).any():
                signatures.append((label, tuple(group["seed"]), values))
        groups: list[tuple[tuple, np.ndarray, list[str]]] = []
        for label, seeds, values in signatures:
            for key, first, members in groups:
                if key == seeds and bool(np.isclose(values, first, rtol=IDENTICAL, atol=0.0, equal_nan=True).all()):
                    members.append(label)
                    break
            else:
                groups.append((seeds, values, [label]))
        found = [(members, len(seeds)) for seeds, _, members in groups if len(members) > 1]
        if found:
            out[workload] = found
    return out


def identical_html(groups: list[tuple[list[str], int]], workload: str = "") -> str:
    """A note under a workload's table for each group of identical_labels: which labels, on how many seeds
    (`workload`: named first, for a table of several workloads)."""
    e = html.escape
    where = f"On {workload}: " if workload else ""
    return "".join(
        f'<p class="identical"><b>{e(where)}Identical on every seed:</b> {e(", ".join(labels))} (final accuracy and '
        f"held-out loss equal to within {IDENTICAL:g} relative on each of {seeds} seed{'s' if seeds != 1 else ''}). "
        "They follow one training trajectory (the same updates, computed in another schedule or placement), so the tie "
        "is by design and only their times tell them apart.</p>\n"
        for labels, seeds in groups)


def algoperf(table: pd.DataFrame, points: int = 301) -> tuple[pd.DataFrame, pd.DataFrame]:
    """summary (runs x columns) -> (scores, profile).

    Submissions are method labels (labels without their network); problems are the (workload, network, seed)
    triples of the folder; t is the time to target (+inf when missed, or when the submission has no run of the
    problem). scores: label, problems, solved (problems it reached the target on), score
    (performance_profiles.algoperf_score, r_max = 4). profile: label, tau, rho on `points` values of tau from 1 to
    r_max.
    """
    data = with_keys(table)
    data["problem"] = list(zip(data["workload"].astype(str), data["network"], data["seed"], strict=True))
    submissions = list(pd.unique(data["method_label"]))
    problems = list(pd.unique(data["problem"]))
    times = np.full((len(submissions), len(problems)), math.inf)
    for row in data.itertuples():
        s, p = submissions.index(row.method_label), problems.index(row.problem)
        times[s, p] = min(times[s, p], float(row.time_to_target_s))
    ratios = performance_profiles.performance_ratios(times)
    scores = pd.DataFrame({"label": submissions, "problems": len(problems), "solved": np.isfinite(times).sum(axis=1),
                           "score": performance_profiles.algoperf_score(ratios)})
    taus = np.linspace(1.0, performance_profiles.R_MAX, points)
    rho = performance_profiles.performance_profile(ratios, taus)
    profile = pd.DataFrame([{"label": label, "tau": tau, "rho": rho[s, i]} for s, label in enumerate(submissions)
                            for i, tau in enumerate(taus)])
    return scores, profile


def covering(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str], int]:
    """summary (every run) -> (runs of the labels that ran every problem, the labels left out, problems).

    A problem is a (workload, network, seed) of the folder; a label (without its network) covers it when it has a
    run of it in any state. Aggregate scores (AlgoPerf) count only the covering labels, so that no label scores
    0 on problems it never ran. Runs that did not complete keep their row with no time to target (a miss).
    """
    data = with_keys(table)
    problems = set(zip(data["workload"].astype(str), data["network"], data["seed"], strict=True))
    ran = {label: set(zip(group["workload"].astype(str), group["network"], group["seed"], strict=True))
           for label, group in data.groupby("method_label", sort=False)}
    keep = [label for label, mine in ran.items() if mine >= problems]
    left_out = [label for label in ran if label not in keep]
    kept = table[data["method_label"].isin(keep)].copy()
    kept.loc[kept["state"] != "completed", "time_to_target_s"] = math.nan
    return kept, left_out, len(problems)


#: What each column of a workload's comparison table is, by its header ({name}: a METRICS display name); the
#: section's prose describes exactly the columns its tables have (column_words).
COLUMN_WORDS = {
    "runs": "the label's runs on the workload that the statistics use.",
    "IQM {name}": "the interquartile mean, the mean of the middle 50% of the runs (rliable), with its stratified "
                  "bootstrap interval (runs resampled within each network).",
    "P({name} better than baseline)": "the probability that a run of the label beats a run of the workload's "
                                      "baseline on the same workload and network (Mann–Whitney U / (n·m), ties one "
                                      "half), with its stratified bootstrap interval; 0.5 is a draw, and the "
                                      "baseline's own row is blank.",
    "MLPerf time to target (s)": "the olympic mean over seeds (the fastest and the slowest run dropped; at least 3 "
                                 "runs, at most one miss).",
}


def column_words(columns: list[str]) -> list[tuple[list[str], str]]:
    """The headers of the section's tables -> [(the headers one COLUMN_WORDS entry describes, its words)], in
    COLUMN_WORDS' order, for the entries with at least one header among `columns`."""
    names = [name for name, _ in METRICS.values()]
    out = []
    for pattern, words in COLUMN_WORDS.items():
        headers = [pattern.format(name=name) for name in names] if "{name}" in pattern else [pattern]
        present = [header for header in dict.fromkeys(headers) if header in columns]
        if present:
            out.append((present, words))
    return out


def workload_table(robust: pd.DataFrame, few_seeds: bool) -> pd.DataFrame:
    """One workload's rows of robust_table -> the table shown: label, runs, each metric's IQM and (with enough seeds)
    probability of improvement, and the MLPerf time; a quality metric that no row has, and without a target the
    times, are left out."""
    shown = pd.DataFrame({"label": robust["label"], "runs": robust["runs"]})
    for metric, (name, _) in METRICS.items():
        unread = metric in QUALITY.values() or robust[f"poi_{metric}"].isna().all()
        if robust[f"iqm_{metric}"].isna().all() and unread:
            continue  # not this workload's reading (or no target): no column
        shown[f"IQM {name}"] = [interval_text(r[f"iqm_{metric}"], r[f"iqm_{metric}_low"], r[f"iqm_{metric}_high"])
                                for _, r in robust.iterrows()]
        if not few_seeds:
            shown[f"P({name} better than baseline)"] = [
                interval_text(r[f"poi_{metric}"], r[f"poi_{metric}_low"], r[f"poi_{metric}_high"], digits=".2f")
                for _, r in robust.iterrows()]
    if not few_seeds and f"IQM {METRICS['time_to_target_s'][0]}" in shown.columns:  # no target: no time column
        shown["MLPerf time to target (s)"] = [number_text(v) for v in robust["mlperf_time_to_target_s"]]
    return shown


def comparisons_html(robust: pd.DataFrame, scores: pd.DataFrame | None, baseline: str | Mapping[str, str | None],
                     few_seeds: bool = False, left_out: list[str] | None = None,
                     identical: Mapping[str, list[tuple[list[str], int]]] | None = None) -> str:
    """The 'Robust comparisons' section: a table per workload (its rows: that workload's labels, compared only with
    runs of the same workload) with IQM and probability of improvement over the workload's baseline (`baseline`: one
    label, or {workload: label or None}), the MLPerf result, and under it the labels `identical` on every seed
    (identical_labels); then (with a target) the AlgoPerf scores, normalised per problem, over the labels that ran
    every problem (`left_out`: the others, named on the page; None: no score for want of a target). `few_seeds`
    (some label has fewer than 3 runs) leaves out the probability of improvement and MLPerf columns, which say
    nothing then (page.small_sample_html says why). The prose describes the columns the tables have, each header
    in a <b class="column">."""
    e = html.escape
    def base_of(workload: str) -> str | None:
        return baseline.get(workload) if isinstance(baseline, Mapping) else baseline

    blocks, columns = [], []
    for workload in pd.unique(robust["workload"].astype(str)):
        rows = robust[robust["workload"].astype(str) == workload]
        shown = workload_table(rows, few_seeds)
        columns += [c for c in shown.columns if c not in columns]
        base = base_of(workload)
        blocks.append(f"<h3>{e(workload)}</h3>\n<p>Baseline: <b>{e(base)}</b>.</p>\n" if base else
                      f"<h3>{e(workload)}</h3>\n<p>No baseline on this workload.</p>\n")
        blocks.append(table_html(shown))
        blocks.append(identical_html((identical or {}).get(workload, [])))
    described = "; ".join(
        ", ".join(f'<b class="column">{e(header)}</b>' for header in headers) + f": {e(words.removesuffix('.'))}"
        for headers, words in column_words(columns[1:]))
    parts = [
        '<section id="comparisons">\n<h2>Robust comparisons</h2>\n',
        "<p>Within each workload: one table per workload, a row per label on it, and every statistic over that "
        "workload's runs alone (a label that ran on several workloads has a row in each table); nothing is averaged "
        "across workloads. "
        + (f"Columns: {described}. " if described else "")
        + ("A missed target counts as slower than any time reached." if any("time to target" in c for c in columns)
           else "")
        + "</p>\n",
        *blocks,
    ]
    skipped = ""
    workloads = robust["workload"].astype(str).nunique()
    labels = robust["method_label"].nunique() if "method_label" in robust.columns else robust["label"].nunique()
    if left_out and (workloads == 1 or len(left_out) < labels):
        skipped = f" Left out, for not running every problem: {', '.join(left_out)}."
    elif left_out:  # every label ran on some workloads only: the reason says more than a list of every label
        skipped = f" Each of the {len(left_out)} labels ran on only some of the {workloads} workloads' problems."
    if scores is not None and len(scores) > 1:
        shown_scores = scores.assign(score=[f"{v:.3f}" for v in scores["score"]])
        parts += [f"<p>AlgoPerf score (Dahl et al. 2023), the one comparison across workloads: each run's time to "
                  "target is first divided by the fastest time on its problem (workload, network, seed), which "
                  "normalises it per workload; the score is the area under each label's performance profile from 1 "
                  f"to {performance_profiles.R_MAX:g}, over {int(scores['problems'].iloc[0])} problems, "
                  "divided by 3: 1 is the fastest to the target on every problem, 0 never within 4x the fastest. Only "
                  f"labels that ran every problem are scored; a run that did not complete counts as a miss.{e(skipped)}"
                  "</p>\n", table_html(shown_scores)]
    elif left_out is not None:
        parts.append(f"<p>No AlgoPerf score: it compares labels over the same problems (workload, network, seed), "
                     f"and fewer than two labels ran every problem.{e(skipped)}</p>\n")
    parts.append("</section>\n")
    return "".join(parts)
