"""A missed target is a censored time, in claims and in rankings: a bound that decides the claim gives its verdict,
one that does not gives INCONCLUSIVE, and no infinity or zero from a missed target reaches a verdict, a CSV or the
page."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_claims import claim, claim_file, write_run

from harness.claims.evaluate import evaluate_claims
from harness.claims.model import load_claims
from harness.cli import main
from harness.report import build, censored, figures, tables
from harness.report.rankings import rankings
from harness.results import load_suite

REACHED, MISSED = 0.95, 0.5  # final accuracies either side of the fake suite's target 0.9


def two_sided(tmp_path: Path, method_runs: list[tuple[float, float]], baseline_runs: list[tuple[float, float]]
              ) -> Path:
    """A suite of dgc against ddp, one (accuracy, seconds) per seed on each side: seconds is the time to target when
    the accuracy reaches it, else only the train time (the target missed)."""
    suite_dir = tmp_path / "results" / "fake"
    for seed, ((ours, our_s), (theirs, their_s)) in enumerate(zip(method_runs, baseline_runs, strict=True)):
        write_run(suite_dir, "dgc", seed, ours, our_s, 10)
        write_run(suite_dir, "ddp", seed, theirs, their_s, 1000)
    return suite_dir


def judged(suite_dir: Path, tmp_path: Path, relation: str, value: float) -> pd.Series:
    table = tables.summary(load_suite(suite_dir))
    path = claim_file(tmp_path / "c.toml", claim("t", "time_to_target_s", relation, value))
    return evaluate_claims(table, load_claims(path), path).iloc[0]


def test_a_fast_method_against_a_baseline_that_missed_passes_only_when_its_train_time_decides(tmp_path: Path) -> None:
    # The audit's case: 3 s against a baseline that never reached the target once gave 0 [0, 0], a PASS at 0.357.
    decided = judged(two_sided(tmp_path / "a", [(REACHED, 3.0)] * 3, [(MISSED, 30.0)] * 3), tmp_path, "ratio_le",
                     0.357)
    assert decided["verdict"] == "PASS" and decided["censored_pairs"] == 3
    assert "> 30 s" in decided["note"] and "0.1 [0.1, 0.1] still holds" in decided["note"]
    # the estimate and interval shown are the bound's that decided it (the baseline at its train time), never 0
    assert decided[["estimate", "ci_low", "ci_high"]].tolist() == pytest.approx([0.1, 0.1, 0.1])
    assert "censored times at the end that hurts the claim" in decided["interval"]
    undecided = judged(two_sided(tmp_path / "b", [(REACHED, 3.0)] * 3, [(MISSED, 5.0)] * 3), tmp_path, "ratio_le",
                       0.357)
    assert undecided["verdict"] == "INCONCLUSIVE" and "decide neither way" in undecided["note"]


def test_a_censored_method_never_passes_a_le_claim_and_fails_only_when_even_its_train_time_is_too_slow(
        tmp_path: Path) -> None:
    slow = judged(two_sided(tmp_path / "a", [(MISSED, 30.0)] * 3, [(REACHED, 10.0)] * 3), tmp_path, "ratio_le", 0.357)
    assert slow["verdict"] == "FAIL" and "3 [3, 3] still fails" in slow["note"]
    short = judged(two_sided(tmp_path / "b", [(MISSED, 2.0)] * 3, [(REACHED, 10.0)] * 3), tmp_path, "ratio_le", 0.357)
    assert short["verdict"] == "INCONCLUSIVE"  # 2 s of training proves nothing against 10 s: it may reach at 3 s
    lenient = judged(two_sided(tmp_path / "c", [(MISSED, 30.0)] * 3, [(REACHED, 10.0)] * 3), tmp_path, "ratio_le", 5)
    assert lenient["verdict"] == "INCONCLUSIVE"  # it may never reach: no PASS however lenient the claim


def test_a_fail_needs_every_pair_to_fail_at_its_best_and_a_pass_every_censored_pair_to_hold_alone(
        tmp_path: Path) -> None:
    # Two uncensored pairs at ratio 0.2 and one whose baseline missed at 4 s against the method's 3 s (0.75 alone).
    mixed = two_sided(tmp_path, [(REACHED, 2.0), (REACHED, 2.0), (REACHED, 3.0)],
                      [(REACHED, 10.0), (REACHED, 10.0), (MISSED, 4.0)])
    row = judged(mixed, tmp_path, "ratio_le", 0.357)
    assert row["verdict"] == "INCONCLUSIVE" and row["censored_pairs"] == 1
    assert math.isnan(row["estimate"]) and row["interval"] == "none: the censored bounds decide nothing"
    assert "seed 2: ddp missed the target (> 4 s)" in row["note"]


def test_ge_claims_mirror_the_rule(tmp_path: Path) -> None:
    # "the method takes at least twice the baseline's time": a method that missed at 30 s against 10 s holds it.
    suite_dir = two_sided(tmp_path, [(MISSED, 30.0)] * 3, [(REACHED, 10.0)] * 3)
    assert judged(suite_dir, tmp_path, "ratio_ge", 2.0)["verdict"] == "PASS"
    assert judged(suite_dir, tmp_path, "ratio_ge", 4.0)["verdict"] == "INCONCLUSIVE"
    # a baseline that missed never passes a _ge claim; one that missed after 30 s fails "at least 2x" for a 3 s
    # method whatever its true time (3 / 30 is already too small, and a longer time only lowers it) ...
    missed_baseline = two_sided(tmp_path / "b", [(REACHED, 3.0)] * 3, [(MISSED, 30.0)] * 3)
    assert judged(missed_baseline, tmp_path, "ratio_ge", 2.0)["verdict"] == "FAIL"
    assert judged(missed_baseline, tmp_path, "ratio_ge", 0.01)["verdict"] == "INCONCLUSIVE"
    # ... while one that missed after 2 s decides nothing about "at least as long" (3 / 2 at best, 0 at worst)
    early = two_sided(tmp_path / "d", [(REACHED, 3.0)] * 3, [(MISSED, 2.0)] * 3)
    assert judged(early, tmp_path, "ratio_ge", 1.0)["verdict"] == "INCONCLUSIVE"
    assert judged(suite_dir, tmp_path, "diff_ge", 15.0)["verdict"] == "PASS"  # 30 - 10 at worst; more only adds


def diverged(suite_dir: Path, method: str, seed: int) -> None:
    """Mark a run of the fake suite diverged (its status; its evaluations stay below the target)."""
    path = next(suite_dir.glob(f"{method}*-s{seed}")) / "status.json"
    path.write_text('{"state": "diverged", "error": {"message": "loss is nan", "rank": 0}, "final": {}}')


def test_a_diverged_method_fails_against_a_baseline_that_arrived(tmp_path: Path) -> None:
    # The audit's case: diverged after 5 s against a baseline at 50 s was censored at 5 s and INCONCLUSIVE on
    # "at most 1x"; a diverged run never reaches the target, so its time is infinite and the claim fails.
    suite_dir = two_sided(tmp_path, [(MISSED, 5.0)] * 3, [(REACHED, 50.0)] * 3)
    for seed in range(3):
        diverged(suite_dir, "dgc", seed)
    row = judged(suite_dir, tmp_path, "ratio_le", 1.0)
    assert row["verdict"] == "FAIL" and row["censored_pairs"] == 0 and math.isinf(row["estimate"])
    assert judged(suite_dir, tmp_path, "ratio_ge", 2.0)["verdict"] == "PASS"  # "at least 2x as long": it is
    # one diverged seed of three is enough: the mean time of a method that can diverge is infinite
    one = two_sided(tmp_path / "one", [(REACHED, 10.0), (REACHED, 10.0), (MISSED, 5.0)], [(REACHED, 50.0)] * 3)
    diverged(one, "dgc", 2)
    assert judged(one, tmp_path, "ratio_le", 1.0)["verdict"] == "FAIL"
    # both diverged in a pair: that pair says nothing of the ratio; both sides diverged in others: undecided
    both = two_sided(tmp_path / "both", [(MISSED, 5.0), (REACHED, 10.0), (REACHED, 10.0), (REACHED, 10.0)],
                     [(MISSED, 5.0), (REACHED, 50.0), (REACHED, 40.0), (REACHED, 45.0)])
    diverged(both, "dgc", 0)
    diverged(both, "ddp", 0)
    row = judged(both, tmp_path, "ratio_le", 1.0)
    assert row["verdict"] == "PASS" and row["pairs"] == 4
    crossed = two_sided(tmp_path / "crossed", [(MISSED, 5.0), (REACHED, 10.0), (REACHED, 10.0)],
                        [(REACHED, 50.0), (MISSED, 5.0), (REACHED, 45.0)])
    diverged(crossed, "dgc", 0)
    diverged(crossed, "ddp", 1)
    assert judged(crossed, tmp_path, "ratio_le", 1.0)["verdict"] == "INCONCLUSIVE"


def test_a_method_that_passed_the_target_then_diverged_never_arrived_in_claims_as_on_the_survival_curve(
        tmp_path: Path) -> None:
    # Each dgc seed reached the target at 10 s, then blew up: the claims and the survival curve agree that it
    # never arrived (its model ends useless), so "at most the baseline's 50 s" fails rather than passing at 0.2.
    suite_dir = two_sided(tmp_path, [(REACHED, 10.0)] * 3, [(REACHED, 50.0)] * 3)
    table = tables.summary(load_suite(suite_dir))
    assert (table.loc[table["method"] == "dgc", "time_to_target_s"] == 10.0).all()
    assert judged(suite_dir, tmp_path, "ratio_le", 1.0)["verdict"] == "PASS"
    for seed in range(3):
        path = next(suite_dir.glob(f"dgc*-s{seed}")) / "status.json"
        status = json.loads(path.read_text())
        path.write_text(json.dumps({**status, "state": "diverged", "error": {"message": "loss is nan", "rank": 0}}))
    table = tables.summary(load_suite(suite_dir))
    assert (table.loc[table["method"] == "dgc", "time_to_target_s"] == 10.0).all()  # it did pass the target once
    row = judged(suite_dir, tmp_path, "ratio_le", 1.0)
    assert row["verdict"] == "FAIL" and math.isinf(row["estimate"])
    survival = figures.survival_rows(table)
    assert not survival.loc[survival["method"] == "dgc", "reached"].any()


def test_the_rankings_speedup_bound_is_on_the_geometric_mean_of_the_per_seed_ratios() -> None:
    # baseline missed at 4 s on every seed, the label reached at 1, 2 and 4 s: the per-seed ratios are at least 4,
    # 2 and 1, so their geometric mean (the speed-up the rankings print) is at least 2; the ratio of the means would
    # say 1.71
    bound, side = censored.speedup_bound(np.array([1.0, 2.0, 4.0]), np.zeros(3, bool), np.array([4.0, 4.0, 4.0]),
                                         np.ones(3, bool))
    assert (bound, side) == (pytest.approx(2.0), ">=")


def test_no_infinity_or_zero_reaches_claims_csv_or_the_page(tmp_path: Path, capsys) -> None:
    suite_dir = two_sided(tmp_path, [(REACHED, 3.0)] * 3, [(MISSED, 5.0)] * 3)
    path = claim_file(tmp_path / "c.toml", claim("t", "time_to_target_s", "ratio_le", 0.357))
    assert main(["claims", str(suite_dir), str(path)]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\binf\b|∞", out) and "n=3 (3 censored)" in out
    with (suite_dir / "report" / "claims.csv").open(newline="") as f:
        row = next(csv.DictReader(f))
    assert row["censored_pairs"] == "3" and row["verdict"] == "INCONCLUSIVE"
    for column in ("estimate", "ci_low", "ci_high"):
        assert row[column] == "" or math.isfinite(float(row[column])) and float(row[column]) != 0.0


@pytest.mark.parametrize(("relation", "value", "expected"), [
    ("ratio_le", 1.0, "PASS"), ("ratio_le", 0.1, "FAIL"), ("ratio_ge", 0.1, "PASS"), ("diff_le", 0.0, "PASS"),
])
def test_the_bound_rule_without_censoring_is_the_plain_interval_rule(relation, value, expected) -> None:
    pairs = censored.CensoredPairs(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0]), np.zeros(3, bool),
                                   np.zeros(3, bool))
    assert censored.bound_verdict(pairs, relation, value).verdict == expected


def test_absdiff_is_two_sided_and_undecided_by_censored_pairs() -> None:
    def pairs(method, baseline, missed=False):
        flags = np.array([missed, False, False])
        return censored.CensoredPairs(np.array(method), np.array(baseline), flags, np.zeros(3, bool))
    assert censored.bound_verdict(pairs([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]), "absdiff_le", 0.001).verdict == "PASS"
    # a method *below* the baseline by more than the tolerance fails too: one-sided diff_le would pass it
    below = pairs([0.9, 0.9, 0.9], [1.0, 1.0, 1.0])
    assert censored.bound_verdict(below, "diff_le", 0.001).verdict == "PASS"
    assert censored.bound_verdict(below, "absdiff_le", 0.001).verdict == "FAIL"
    assert censored.bound_verdict(pairs([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], missed=True), "absdiff_le",
                                  0.001).verdict == "INCONCLUSIVE"


def test_the_rankings_speedup_is_a_bound_where_the_bound_decides(tmp_path: Path) -> None:
    suite_dir = two_sided(tmp_path, [(REACHED, 3.0)] * 3, [(MISSED, 9.0)] * 3)
    table = tables.summary(load_suite(suite_dir))
    ranked = rankings(table, "ddp x2", 0.9).set_index("label")
    assert math.isnan(ranked.loc["dgc x2", "speedup_vs_baseline"])
    assert ranked.loc["dgc x2", "speedup_bound"] == pytest.approx(3.0)
    assert ranked.loc["dgc x2", "speedup_bound_side"] == ">="
    page = build.write_report(suite_dir).read_text()
    assert "≥ 3.00x" in page and "at least 3.00x the speed of the baseline" in page and "∞" not in page
    # a baseline that missed after 2 s says nothing about a label that took 3 s: no bound, "–"
    short = two_sided(tmp_path / "b", [(REACHED, 3.0)] * 3, [(MISSED, 2.0)] * 3)
    ranked = rankings(tables.summary(load_suite(short)), "ddp x2", 0.9).set_index("label")
    assert math.isnan(ranked.loc["dgc x2", "speedup_bound"]) and ranked.loc["dgc x2", "speedup_bound_side"] == ""
    # a label that missed against a baseline that reached faster than the label's train time: at most that ratio
    slow = two_sided(tmp_path / "c", [(MISSED, 20.0)] * 3, [(REACHED, 5.0)] * 3)
    ranked = rankings(tables.summary(load_suite(slow)), "ddp x2", 0.9).set_index("label")
    assert ranked.loc["dgc x2", "speedup_bound"] == pytest.approx(0.25)
    assert ranked.loc["dgc x2", "speedup_bound_side"] == "<="
