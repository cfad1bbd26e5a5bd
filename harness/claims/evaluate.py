"""Judging claims on a suite's summary: paired t intervals of a ratio or difference, looked at seed by seed, and their
verdicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.claims.model import Claim, ClaimFile
from harness.claims.sequential import MIN_SEEDS, Design
from harness.report import censored, hygiene, stats
from harness.report.network import method_label
from harness.report.paired import ALPHA, interval_name
from harness.suite.files import FileError

#: Run states whose numbers a claim uses: a diverged run is an outcome of the method; failed or preempted runs
#: are not (the infrastructure stopped them).
USED_STATES = ("completed", "diverged")
#: Metrics a run has before its first step (its memory plan): a run that did not fit its memory_per_rank has them too.
PLAN_METRICS = ("planned_memory_bytes", "memory_per_rank")
#: claims.csv's columns, in order: the contract's six first.
CLAIM_COLUMNS = ("id", "statement", "estimate", "ci_low", "ci_high", "verdict", "metric", "relation", "value",
                 "method", "baseline", "pairs", "noisy_runs", "setting", "source", "note", "censored_pairs", "kind",
                 "seeds", "interval", "next_look")
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
    baseline, method_censored, baseline_censored, noisy (either side noisy), seed. Only runs in USED_STATES (and,
    for a PLAN_METRICS metric, runs refused as does_not_fit, which have their plan). A completed run that missed
    the target is censored: its value is the run's train time T (the time to target is known only to exceed it),
    and its *_censored flag is True. A diverged run never reaches the target, even one that passed it before it blew
    up (its model ends useless): its time is +inf, known, not censored, as on the page's survival curves
    (figures.survival_rows). Pairs with another missing value are left out."""
    def side(mask: pd.Series) -> pd.DataFrame:
        states = (*USED_STATES, "does_not_fit") if metric in PLAN_METRICS else USED_STATES
        rows = table[mask & table["state"].isin(states)]
        values = pd.to_numeric(rows[metric], errors="coerce").astype(float)
        censored = pd.Series(False, index=rows.index)
        if metric in CENSORED_METRICS:
            bound = pd.to_numeric(rows["train_time_s"], errors="coerce").astype(float)
            never = rows["state"] == "diverged"
            censored = values.isna() & bound.notna() & ~never
            values = values.where(~censored, bound).where(~never, math.inf)
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
                         "noisy": pairs["noisy_method"] | pairs["noisy_baseline"],
                         "seed": [key[2] for key in pairs["key"]]})


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


def _look(pairs: pd.DataFrame, claim: Claim, alpha: float) -> tuple[str, censored.BoundVerdict, list[str], bool]:
    """The verdict on `pairs` at `alpha` on each side, the bound that decided it, the notes it needs (censored
    pairs; a time judged on noisy runs, which makes a decided verdict INCONCLUSIVE), and whether noisy runs did."""
    flags = [pairs[column].to_numpy(dtype=bool) for column in ("method_censored", "baseline_censored")]
    decided = censored.bound_verdict(censored.CensoredPairs(pairs["method"].to_numpy(dtype=float),
                                                           pairs["baseline"].to_numpy(dtype=float), *flags),
                                     claim.relation, claim.value, alpha)
    result, notes = decided.verdict, []
    if (flags[0] | flags[1]).any():
        notes.append(_censored_note(pairs, claim, decided))
    noisy = int(pairs["noisy"].sum())
    blocked = False
    if len(pairs) < MIN_SEEDS:
        result = "INCONCLUSIVE"
        notes.append(f"only {len(pairs)} paired seed(s): {MIN_SEEDS} needed")
    elif noisy and claim.metric in hygiene.TIME_COLUMNS and result != "INCONCLUSIVE":
        notes.append(f"would be {result}, but {noisy} of the {len(pairs)} pairs include a noisy run (starved of "
                     "CPU): a time is not judged on them")
        result, blocked = "INCONCLUSIVE", True
    return result, decided, notes, blocked


def judge(table: pd.DataFrame, claim: Claim, method: pd.Series, baseline: pd.Series,
          design: Design | None = None) -> dict[str, Any]:
    """One claim on the runs `method` and `baseline` (masks of `table`) -> its claims.csv row.

    Without a `design`, one look at every pair at ALPHA on each side (a 95% interval). With one, a look at each of
    its seed counts that the pairs reach, on the pairs of the first that many seeds, at the design's share of the
    error per look: the first look that decides gives the verdict, and `seeds` says how many it needed;
    `next_look` is the seeds that the next look needs when none has decided and more seeds could (not for a time
    on noisy runs, nor for a claim that needs a cluster). The estimate and interval are the paired t's
    (harness/report/paired.py) at the look that decided, or the last one; where pairs are censored, those of the
    bound that decided (censored.bound_verdict; NaN when none did), the note naming each censored pair.
    """
    pairs = paired_values(table, method, baseline, claim.metric)
    kind = censored.kind_of(claim.relation)
    seeds = sorted(set(pairs["seed"]))
    looks = design.looks if design is not None else (len(seeds),)
    alpha = design.alpha_per_look if design is not None else ALPHA
    reached = [n for n in looks if n <= len(seeds)] or [len(seeds)]
    for n in reached:
        used = pairs[pairs["seed"].isin(seeds[:n])]
        result, decided, notes, noisy = _look(used, claim, alpha)
        if result != "INCONCLUSIVE":
            break
    judged = len(set(used["seed"]))
    # more seeds cannot undo noisy runs among the first ones
    more = design.next_look(judged) if design is not None and result == "INCONCLUSIVE" and not noisy else None
    notes = ([claim.note] if claim.note else []) + notes
    if design is not None and claim.kind != "cluster":
        notes.append(f"decided at the look of {judged} seeds" if result != "INCONCLUSIVE" else
                     f"undecided at {judged} seeds; the next look needs {more}" if more is not None else
                     f"undecided at {judged} seeds: more seeds cannot undo the noisy runs, rerun those on a quiet "
                     "machine" if noisy else f"undecided at {judged} seeds, the last look ({design.max_seeds})")
    if claim.kind == "cluster":
        notes.append(f"would be {result} here, but needs a cluster: {claim.why}" if result != "INCONCLUSIVE"
                     else f"needs a cluster: {claim.why}")
        result, more = "INCONCLUSIVE", None
    elif claim.kind == "design":
        notes.append(f"design check, not evidence: {claim.why}")
    cut = ~(used["method_censored"] | used["baseline_censored"])
    return {"id": claim.id, "statement": claim.statement, "estimate": decided.estimate, "ci_low": decided.low,
            "ci_high": decided.high, "verdict": result, "metric": claim.metric, "relation": claim.relation,
            "value": claim.value, "method": claim.method, "baseline": claim.baseline, "pairs": len(used),
            "noisy_runs": int(used["noisy"].sum()), "setting": claim.setting, "source": claim.source,
            "note": "; ".join(notes), "censored_pairs": int((~cut).sum()), "kind": claim.kind, "seeds": judged,
            "interval": _interval_words(kind, alpha, design, cut.all(), decided.side),
            "next_look": math.nan if more is None else more}


def _interval_words(kind: str, alpha: float, design: Design | None, uncensored: bool, side: str) -> str:
    """claims.csv's `interval`: what ci_low and ci_high are."""
    words = interval_name(kind, alpha, len(design.looks) if design is not None else 1)
    if uncensored:
        return words
    if side:
        return f"{words}, censored times at the end that {'hurts' if side == 'worst' else 'helps'} the claim"
    return "none: the censored bounds decide nothing"


@stats.extreme_values_shown
def evaluate_claims(table: pd.DataFrame, claims: ClaimFile, path: str | Path = "claims",
                    design: Design | None = None) -> pd.DataFrame:
    """summary (runs x columns), a loaded claim file -> claims (one row per claim x CLAIM_COLUMNS).

    Raises FileError (one line naming the file and the field) when a claim names no run, or the file is meant for
    another suite. Each claim is judged by `judge`, under `design` (by default the file's [sequential] table's;
    none: one look at every pair, 95%), and its PASS counts only when its controls PASS (_with_controls).
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
        rows.append(judge(table, claim, *masks, design if design is not None else claims.design()))
    return pd.DataFrame(_with_controls(rows, claims), columns=list(CLAIM_COLUMNS))


def _with_controls(rows: list[dict[str, Any]], claims: ClaimFile) -> list[dict[str, Any]]:
    """A PASS whose required claims (Claim.requires) did not all PASS becomes INCONCLUSIVE: it may hold for a reason
    other than the paper's. Its note names the controls and their verdicts. Repeated until nothing changes, so a
    chain (A requires B requires C) demotes A when C does not pass; it ends, since a verdict only ever goes from
    PASS to INCONCLUSIVE."""
    by_id = {row["id"]: row for row in rows}
    changed = True
    while changed:
        changed = False
        for row, claim in zip(rows, claims.claim, strict=True):
            missing = [f"{name} is {by_id[name]['verdict']}" for name in claim.requires
                       if by_id[name]["verdict"] != "PASS"]
            if missing and row["verdict"] == "PASS":
                row["verdict"] = "INCONCLUSIVE"
                row["note"] = "; ".join(filter(None, [row["note"], (
                    f"would be PASS, but its control did not pass ({', '.join(missing)}): it may hold without the "
                    "mechanism the paper credits")]))
                changed = True
    return rows
