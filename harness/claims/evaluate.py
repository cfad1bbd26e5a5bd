"""Judging claims on a suite's summary: paired bootstrap intervals of a ratio or difference, and their verdicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.claims.model import Claim, ClaimFile
from harness.report import censored, hygiene, stats
from harness.report.network import method_label
from harness.suite.files import FileError

#: Fewer paired seeds than this make a claim INCONCLUSIVE, whatever the interval says.
MIN_SEEDS = 3
#: Run states whose numbers a claim uses: a diverged run is an outcome of the method; failed or preempted runs
#: are not (the infrastructure stopped them).
USED_STATES = ("completed", "diverged")
#: Metrics a run has before its first step (its memory plan): a run that did not fit its memory_per_rank has them too.
PLAN_METRICS = ("planned_memory_bytes", "memory_per_rank")
#: claims.csv's columns, in order: the contract's six first.
CLAIM_COLUMNS = ("id", "statement", "estimate", "ci_low", "ci_high", "verdict", "metric", "relation", "value",
                 "method", "baseline", "pairs", "noisy_runs", "setting", "source", "note", "censored_pairs", "kind")
#: Metrics where a missing value is censored (a missed target: the time exceeds the run's train time), not absent.
CENSORED_METRICS = ("time_to_target_s",)


def matching_rows(table: pd.DataFrame, name: str) -> pd.Series:
    """summary (runs x columns), a claim's method or baseline -> a boolean mask of the runs it names.

    `name` is, in this order: a label without its ' @ <network>' part (so it names the same method at every network,
    as `dtbench report --baseline` does), a full label, or a method name that every run of it shares one label
    without network. Raises ValueError (one line) when nothing matches or a method name is ambiguous.
    """
    networks = table["network"].fillna("").astype(str)
    labels = pd.Series([method_label(str(label), net) for label, net in zip(table["label"], networks, strict=True)],
                       index=table.index)
    for mask in (labels == name, table["label"].astype(str) == name):
        if mask.any():
            return mask
    by_method = table["method"].astype(str) == name
    if by_method.any():
        found = list(pd.unique(labels[by_method]))
        if len(found) > 1:
            raise ValueError(f"method {name!r} has several labels here ({', '.join(found)}): name one of them")
        return by_method
    known = ", ".join(pd.unique(labels))
    raise ValueError(f"no run has the label or method {name!r} (labels: {known})")


def paired_values(table: pd.DataFrame, method: pd.Series, baseline: pd.Series, metric: str) -> pd.DataFrame:
    """The metric of the method's and the baseline's runs, paired by (workload, network, seed): columns key, method,
    baseline, method_censored, baseline_censored, noisy (either side noisy). Only runs in USED_STATES (and, for a
    PLAN_METRICS metric, runs refused as does_not_fit, which have their plan). A missed
    target is censored: its value is the run's train time T (the time to target is known only to exceed it), and
    its *_censored flag is True. Pairs with another missing value are left out."""
    def side(mask: pd.Series) -> pd.DataFrame:
        states = (*USED_STATES, "does_not_fit") if metric in PLAN_METRICS else USED_STATES
        rows = table[mask & table["state"].isin(states)]
        values = pd.to_numeric(rows[metric], errors="coerce").astype(float)
        censored = pd.Series(False, index=rows.index)
        if metric in CENSORED_METRICS:
            bound = pd.to_numeric(rows["train_time_s"], errors="coerce").astype(float)
            censored = values.isna() & bound.notna()
            values = values.where(~censored, bound)
        keys = list(zip(rows["workload"].astype(str), rows["network"].fillna("").astype(str), rows["seed"],
                        strict=True))
        noisy = rows["noisy"].astype("boolean").fillna(False).astype(bool) if "noisy" in rows else False
        return pd.DataFrame({"key": keys, "value": values.to_numpy(), "censored": censored.to_numpy(dtype=bool),
                             "noisy": np.asarray(noisy)})

    ours, theirs = side(method), side(baseline)
    pairs = ours.merge(theirs, on="key", suffixes=("_method", "_baseline"))
    pairs = pairs[pairs["value_method"].notna() & pairs["value_baseline"].notna()]
    return pd.DataFrame({"key": pairs["key"], "method": pairs["value_method"], "baseline": pairs["value_baseline"],
                         "method_censored": pairs["censored_method"], "baseline_censored": pairs["censored_baseline"],
                         "noisy": pairs["noisy_method"] | pairs["noisy_baseline"]})


def verdict(relation: str, value: float, low: float, high: float) -> str:
    """PASS when the whole interval [low, high] satisfies the relation to `value`, FAIL when the whole interval
    violates it, INCONCLUSIVE otherwise (and when the interval is unknown)."""
    return censored.interval_verdict(relation, value, low, high)


def _censored_note(pairs: pd.DataFrame, claim: Claim, decided: censored.BoundVerdict) -> str:
    """The note naming the censored pairs, their bounds, and what the bounds decided."""
    named = []
    for row in pairs[pairs["method_censored"] | pairs["baseline_censored"]].itertuples():
        workload, network, seed = row.key
        where = f"{workload}{' @ ' + network if network else ''} seed {seed}"
        missed = [f"{name} missed the target (> {bound:.4g} s)" for name, bound, flag in
                  ((claim.method, row.method, row.method_censored), (claim.baseline, row.baseline,
                                                                     row.baseline_censored)) if flag]
        named.append(f"{where}: {' and '.join(missed)}")
    text = f"{len(named)} censored pair(s), a missed target's time known only to exceed its train time: " + "; ".join(
        named)
    if decided.side == "worst":
        return text + (f"; with every censored time against the claim, {decided.estimate:.4g} "
                       f"[{decided.low:.4g}, {decided.high:.4g}] still holds: PASS")
    if decided.side == "best":
        return text + (f"; with every censored time for the claim, {decided.estimate:.4g} "
                       f"[{decided.low:.4g}, {decided.high:.4g}] still fails: FAIL")
    return text + "; the bounds decide neither way: INCONCLUSIVE"


def judge(table: pd.DataFrame, claim: Claim, method: pd.Series, baseline: pd.Series) -> dict[str, Any]:
    """One claim on the runs `method` and `baseline` (masks of `table`) -> its claims.csv row.

    Without censored pairs the estimate and interval are those of every pair (stats.paired_bootstrap). With some,
    they are those of the uncensored pairs alone (NaN with none), and the verdict is censored.bound_verdict's, the
    note naming each censored pair and its bound: no infinity from a missed target reaches a number.
    """
    pairs = paired_values(table, method, baseline, claim.metric)
    kind = censored.kind_of(claim.relation)
    flags = [pairs[column].to_numpy(dtype=bool) for column in ("method_censored", "baseline_censored")]
    decided = censored.bound_verdict(censored.CensoredPairs(pairs["method"].to_numpy(dtype=float),
                                                           pairs["baseline"].to_numpy(dtype=float), *flags),
                                     claim.relation, claim.value)
    cut = ~(flags[0] | flags[1])
    estimate, low, high = stats.paired_bootstrap(pairs["method"].to_numpy(dtype=float)[cut],
                                                 pairs["baseline"].to_numpy(dtype=float)[cut], kind)
    result = decided.verdict
    notes = [claim.note] if claim.note else []
    if (~cut).any():
        notes.append(_censored_note(pairs, claim, decided))
    noisy = int(pairs["noisy"].sum())
    if len(pairs) < MIN_SEEDS:
        result = "INCONCLUSIVE"
        notes.append(f"only {len(pairs)} paired seed(s): {MIN_SEEDS} needed")
    elif noisy and claim.metric in hygiene.TIME_COLUMNS and result != "INCONCLUSIVE":
        notes.append(f"would be {result}, but {noisy} of the {len(pairs)} pairs include a noisy run (starved of "
                     "CPU): a time is not judged on them")
        result = "INCONCLUSIVE"
    if claim.kind == "cluster":
        notes.append(f"would be {result} here, but needs a cluster: {claim.why}" if result != "INCONCLUSIVE"
                     else f"needs a cluster: {claim.why}")
        result = "INCONCLUSIVE"
    elif claim.kind == "design":
        notes.append(f"design check, not evidence: {claim.why}")
    return {"id": claim.id, "statement": claim.statement, "estimate": estimate, "ci_low": low, "ci_high": high,
            "verdict": result, "metric": claim.metric, "relation": claim.relation, "value": claim.value,
            "method": claim.method, "baseline": claim.baseline, "pairs": len(pairs), "noisy_runs": noisy,
            "setting": claim.setting, "source": claim.source, "note": "; ".join(notes),
            "censored_pairs": int((~cut).sum()), "kind": claim.kind}


@stats.extreme_values_shown
def evaluate_claims(table: pd.DataFrame, claims: ClaimFile, path: str | Path = "claims") -> pd.DataFrame:
    """summary (runs x columns), a loaded claim file -> claims (one row per claim x CLAIM_COLUMNS).

    Raises FileError (one line naming the file and the field) when a claim names no run, or the file is meant for
    another suite. The estimate is mean(method)/mean(baseline) or mean(method - baseline) over the paired seeds,
    with the 95% paired percentile bootstrap interval (stats.paired_bootstrap).
    """
    suites = set(table["suite"].dropna().astype(str))
    if claims.suite is not None and suites and claims.suite not in suites:
        raise FileError(f"{path}: suite: the claims are about suite {claims.suite!r}, the results are of "
                        f"{', '.join(sorted(suites))}")
    rows = []
    for i, claim in enumerate(claims.claim):
        masks = []
        for field in ("method", "baseline"):
            try:
                masks.append(matching_rows(table, getattr(claim, field)))
            except ValueError as exc:
                raise FileError(f"{path}: claim[{i}].{field}: {exc}") from None
        rows.append(judge(table, claim, *masks))
    return pd.DataFrame(_with_controls(rows, claims), columns=list(CLAIM_COLUMNS))


def _with_controls(rows: list[dict[str, Any]], claims: ClaimFile) -> list[dict[str, Any]]:
    """A PASS whose required claims (Claim.requires) did not all PASS becomes INCONCLUSIVE: it may hold for a reason
    other than the paper's. Its note names the controls and their verdicts."""
    verdicts = {row["id"]: row["verdict"] for row in rows}
    for row, claim in zip(rows, claims.claim, strict=True):
        missing = [f"{name} is {verdicts[name]}" for name in claim.requires if verdicts[name] != "PASS"]
        if missing and row["verdict"] == "PASS":
            row["verdict"] = "INCONCLUSIVE"
            row["note"] = "; ".join(filter(None, [row["note"], (
                f"would be PASS, but its control did not pass ({', '.join(missing)}): it may hold without the "
                "mechanism the paper credits")]))
    return rows


#: The kinds of claim, in the order the terminal and the page show them, each with its heading.
KIND_HEADINGS = {"evidence": "Evidence", "design": "Design checks: values the implementation fixes, not evidence",
                 "cluster": "Needs a cluster: measured here, not judged"}


def _seeds(row: Any) -> str:
    """'3' or '3 (1 censored)'."""
    censored_pairs = int(getattr(row, "censored_pairs", 0) or 0)
    return f"{row.pairs}" + (f" ({censored_pairs} censored)" if censored_pairs else "")


def _counts(claims: pd.DataFrame) -> str:
    counts = claims["verdict"].value_counts()
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in ("PASS", "FAIL", "INCONCLUSIVE"))


def claims_text(claims: pd.DataFrame) -> str:
    """claims (rows x CLAIM_COLUMNS) -> a fixed-width table for the terminal: verdict, id, estimate [interval],
    relation, paired seeds and the statement, with notes on the next line; evidence first, then design checks and
    claims that need a cluster, each under its heading, and the counts of each."""
    def number(value: float) -> str:
        return "–" if math.isnan(value) else f"{value:.4g}"

    kinds = claims["kind"] if "kind" in claims else pd.Series("evidence", index=claims.index)
    cells = [(row.verdict, row.id, f"{number(row.estimate)} [{number(row.ci_low)}, {number(row.ci_high)}]",
              f"{row.relation} {row.value:g}", f"n={_seeds(row)}", row.statement, row.note)
             for row in claims.itertuples()]
    widths = [max((len(c[i]) for c in cells), default=0) for i in range(5)]
    lines = []
    for kind, heading in KIND_HEADINGS.items():
        mine = [cell for cell, k in zip(cells, kinds, strict=True) if k == kind]
        if not mine:
            continue
        if kind != "evidence" or set(kinds) != {"evidence"}:
            lines.append(f"{heading}:")
        for cell in mine:
            lines.append("  ".join(f"{cell[i]:<{widths[i]}}" for i in range(5)) + "  " + cell[5])
            if cell[6]:
                lines.append(" " * (widths[0] + 2) + "note: " + cell[6])
    lines.append(_counts(claims[kinds == "evidence"]))
    if (kinds == "design").any():
        lines.append("design checks: " + _counts(claims[kinds == "design"]))
    if (kinds == "cluster").any():
        lines.append(f"needs a cluster: {int((kinds == 'cluster').sum())} (not judged here)")
    return "\n".join(lines)


def claims_html(claims: pd.DataFrame, source: Path) -> str:
    """The report's Claims section: one row per claim with its verdict, estimate and interval; design checks and
    claims that need a cluster in tables of their own, after the evidence."""
    import html

    e = html.escape

    def number(value: float) -> str:
        return "–" if math.isnan(value) else f"{value:.4g}"

    def table(rows: pd.DataFrame) -> str:
        body = "\n".join(
            f'<tr><td>{e(row.id)}</td><td class="{e(row.verdict)}">{e(row.verdict)}</td>'
            f"<td>{number(row.estimate)} [{number(row.ci_low)}, {number(row.ci_high)}]</td>"
            f"<td>{e(row.relation)} {row.value:g}</td><td>{e(_seeds(row))}</td><td>{e(row.setting)}</td>"
            f"<td style=\"text-align:left\">{e(row.statement)}<br><small>{e(row.source)}"
            f"{'; ' + e(row.note) if row.note else ''}</small></td></tr>"
            for row in rows.itertuples())
        return ("<table><tr><th>id</th><th>verdict</th><th>estimate [95% CI]</th><th>claim</th><th>seeds</th>"
                f"<th>setting</th><th>statement</th></tr>\n{body}\n</table>\n")

    kinds = claims["kind"] if "kind" in claims else pd.Series("evidence", index=claims.index)
    parts = [f"<h2>Claims</h2>\n<p>From <code>{e(str(source))}</code>: each claim over seeds paired by workload, "
             "network and seed, with the 95% paired bootstrap interval of the ratio or difference. PASS: the whole "
             "interval satisfies the claim; FAIL: the whole interval violates it; INCONCLUSIVE: otherwise, with "
             f"fewer than {MIN_SEEDS} paired seeds, or for a time measured on noisy runs. A missed target is a "
             "censored time (known only to exceed the run's train time): a claim with censored pairs is PASS only "
             "if it holds with every censored time against it, FAIL only if it fails with every one for it, and "
             "its interval is that of the uncensored pairs.</p>\n"]
    for kind, heading in KIND_HEADINGS.items():
        rows = claims[kinds == kind]
        if rows.empty:
            continue
        if kind != "evidence":
            parts.append(f'<h3 id="claims-{kind}">{e(heading)}</h3>\n')
        parts.append(table(rows))
    return "".join(parts)
