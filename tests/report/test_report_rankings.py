"""The report's rankings per workload (speed-up over the baseline, paired by seed), its per-workload tables, the
small-sample notice, and aggregate scores only over labels that ran every problem."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_report import DDP, QSGD, write_run

from harness.report import build, comparisons, page, rankings, tables

NAN = math.nan


def runs(rows: list[tuple]) -> pd.DataFrame:
    """(label, method, workload, seed, state, time_to_target_s, final_accuracy) -> a summary-like table."""
    table = pd.DataFrame(rows, columns=["label", "method", "workload", "seed", "state", "time_to_target_s",
                                        "final_accuracy"])
    return table.assign(network="", bytes_per_sample=100.0, family="f", suite="s")


@pytest.fixture
def table() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):
        rows.append(("ddp", "ddp", "a", seed, "completed", 2.0, 0.96))
        rows.append(("fast", "dgc", "a", seed, "completed", 1.0, 0.955))
        rows.append(("half", "qsgd", "a", seed, "completed", 1.5 if seed == 0 else NAN, 0.94))
        rows.append(("never", "terngrad", "a", seed, "completed", NAN, 0.93 - 0.01 * seed))
        rows.append(("worse", "onebit", "a", seed, "completed", NAN, 0.50))
        rows.append(("broken", "pb", "a", seed, "diverged", NAN, NAN))
        rows.append(("fast", "dgc", "b", seed, "completed", 3.0, 0.97))
        rows.append(("ddp", "ddp", "b", seed, "diverged", NAN, NAN))
    return runs(rows)


def test_rankings_order_speedup_and_states(table: pd.DataFrame) -> None:
    ranked = rankings.rankings(table, "ddp", 0.95)
    a = ranked[ranked["workload"] == "a"].set_index("label")
    # Reached on every run by time, then reached on some, then by final accuracy, then no completed run.
    assert list(a.index) == ["fast", "ddp", "half", "never", "worse", "broken"]
    assert list(a["rank"].iloc[:5]) == [1, 2, 3, 4, 5] and pd.isna(a.loc["broken", "rank"])
    # 2.0 s on both seeds over 1.0 s on both: 2x, an interval of one point.
    assert a.loc["fast", ["speedup_vs_baseline", "speedup_ci_low", "speedup_ci_high", "speedup_pairs"]].tolist() == (
        pytest.approx([2.0, 2.0, 2.0, 2]))
    assert a.loc["half", "reached"] == 1 and a.loc["half", "time_to_target_s"] == pytest.approx(1.5)
    for label in ("ddp", "half", "never", "broken"):  # the baseline itself, a missed seed, never, nothing completed
        assert math.isnan(a.loc[label, "speedup_vs_baseline"]), label
    assert a.loc["never", "final_accuracy"] == pytest.approx(0.925)
    assert (a.loc["broken", "completed"], a.loc["broken", "runs"], a.loc["broken", "states"]) == (0, 2, "diverged 2")
    assert not (ranked["speedup_vs_baseline"] == math.inf).any()


def test_speedup_is_paired_by_seed_with_a_t_interval() -> None:
    table = runs([("ddp", "ddp", "a", 0, "completed", 2.0, 0.9), ("ddp", "ddp", "a", 1, "completed", 4.0, 0.9),
                  ("x", "dgc", "a", 0, "completed", 1.0, 0.9), ("x", "dgc", "a", 1, "completed", 1.0, 0.9),
                  ("x", "dgc", "a", 7, "completed", 9.0, 0.9)])  # seed 7 has no baseline run: not paired
    row = rankings.rankings(table, "ddp", 0.95).set_index("label").loc["x"]
    # the geometric mean of the ratios 2 and 4 on seeds 0 and 1; with 2 pairs the t interval (1 degree of freedom,
    # t = 12.7) spans far past both: two seeds decide nothing (a bootstrap of them was their min-max, [2, 4])
    assert row["speedup_vs_baseline"] == pytest.approx(8 ** 0.5)
    assert row["speedup_pairs"] == 2
    assert row["speedup_ci_low"] < 1.0 and row["speedup_ci_high"] > 100.0
    per_run = rankings.run_speedups(table, rankings.rankings(table, "ddp", 0.95), "ddp")
    assert per_run["speedup_vs_baseline"].tolist()[2:4] == pytest.approx([2.0, 4.0])  # each seed's own ratio
    assert per_run.iloc[:2].isna().all().all() and math.isnan(per_run.iloc[4]["speedup_vs_baseline"])
    assert per_run.iloc[2]["speedup_ci_low"] == pytest.approx(row["speedup_ci_low"])


def test_no_infinite_speedup_from_a_target_met_at_once() -> None:
    # The runner evaluates before the first step: a low target can be met at 0 s.
    table = runs([("ddp", "ddp", "a", 0, "completed", 2.0, 0.9), ("ddp", "ddp", "a", 1, "completed", 2.0, 0.9),
                  ("x", "dgc", "a", 0, "completed", 0.0, 0.9), ("x", "dgc", "a", 1, "completed", 1.0, 0.9),
                  ("x", "dgc", "a", 1, "completed", 5.0, 0.9)])  # a second run of seed 1 (other options): one pair
    row = rankings.rankings(table, "ddp", 0.5).set_index("label").loc["x"]
    assert row["speedup_pairs"] == 2
    assert all(math.isnan(row[c]) for c in rankings.SPEEDUP_COLUMNS)
    assert not np.isinf(rankings.run_speedups(table, rankings.rankings(table, "ddp", 0.5), "ddp").to_numpy()).any()


def test_verdicts_name_the_winner_or_say_why_there_is_none(table: pd.DataFrame) -> None:
    ranked = rankings.rankings(table, "ddp", 0.95)
    a, b = (ranked[ranked["workload"] == w] for w in ("a", "b"))
    assert rankings.verdict(a, "ddp") == (
        "On a, fast reached the target 0.95 fastest, in 1 s (mean of 2 runs): 2.00x [2.00, 2.00] the speed of the "
        "baseline ddp.")
    assert rankings.verdict(b, "ddp") == (
        "On b, fast reached the target 0.95 fastest, in 3 s (mean of 2 runs); the baseline ddp has no completed run "
        "here, so no speed-up is given.")
    none = rankings.rankings(table.assign(time_to_target_s=NAN), "ddp", 0.95)
    assert rankings.verdict(none[none["workload"] == "a"], "ddp") == (
        "On a, no label reached the target 0.95; ddp ended most accurate (0.96).")
    html = rankings.rankings_html(ranked, "ddp")
    assert html.startswith('<section id="rankings">') and "<h3>a</h3>" in html and "<h3>b</h3>" in html
    assert "– (0 of 2 completed: diverged 2)" in html and "1.5 (1 of 2)" in html and "not reached (0 of 2)" in html
    # Workload b sets no target (or its runs set different ones): it ranks by final accuracy, untimed.
    mixed = rankings.rankings(table, "ddp", {"a": 0.95, "b": None})
    untimed = mixed[mixed["workload"] == "b"]
    assert untimed["label"].tolist() == ["fast", "ddp"] and untimed["target_accuracy"].isna().all()
    assert rankings.verdict(untimed, "ddp") == "On b, fast ended most accurate: 0.97."
    text = rankings.rankings_html(mixed, "ddp")
    b_part = text[text.index("<h3>b</h3>"):]
    assert "speed-up vs" not in b_part and "time to target" not in b_part and "speed-up vs" in text
    by_accuracy = rankings.rankings(table, "ddp", None)
    assert by_accuracy[by_accuracy["workload"] == "a"]["label"].tolist()[:3] == ["ddp", "fast", "half"]


def test_rank_order_of_the_per_label_table_within_each_workload(table: pd.DataFrame) -> None:
    aggregates = tables.aggregate(table)
    assert len(aggregates) == 8  # fast and ddp ran both workloads: one row each per workload
    ordered = rankings.in_rank_order(aggregates, rankings.rankings(table, "ddp", 0.95))
    assert list(zip(ordered["workload"], ordered["label"], strict=True)) == [
        ("a", "fast"), ("a", "ddp"), ("a", "half"), ("a", "never"), ("a", "worse"), ("a", "broken"), ("b", "fast"),
        ("b", "ddp")]
    shown = page.aggregate_display(ordered)
    assert list(shown.columns[:2]) == ["workload", "label"]
    assert shown["reached target"].tolist()[:6] == ["2/2", "2/2", "1/2", "0/2", "0/2",
                                                    "– (0 of 2 completed: diverged 2)"]


def test_small_sample_notice_below_three_seeds_only(table: pd.DataFrame) -> None:
    assert "Few seeds" in page.small_sample_html(tables.aggregate(table))
    three = pd.concat([table, table.assign(seed=table["seed"] + 2), table.assign(seed=table["seed"] + 4)])
    assert page.fewest_runs(tables.aggregate(three)) == 6
    assert page.small_sample_html(tables.aggregate(three[three["seed"] < 3])) == ""
    robust = comparisons.robust_table(three, "ddp")
    assert "MLPerf" in comparisons.comparisons_html(robust, None, "ddp", few_seeds=False)
    assert "MLPerf" not in comparisons.comparisons_html(robust, None, "ddp", few_seeds=True).split("</p>")[1]


def test_algoperf_counts_only_labels_that_ran_every_problem(table: pd.DataFrame) -> None:
    kept, left_out, problems = comparisons.covering(table)
    assert problems == 4 and set(kept["label"]) == {"ddp", "fast"}
    assert left_out == ["half", "never", "worse", "broken"]
    assert kept.loc[kept["state"] != "completed", "time_to_target_s"].isna().all()  # a diverged run is a miss
    scores, _ = comparisons.algoperf(kept)
    assert set(scores["label"]) == {"ddp", "fast"} and (scores["problems"] == 4).all()
    text = comparisons.comparisons_html(comparisons.robust_table(table, "ddp"), scores, "ddp", True, left_out)
    assert "Left out, for not running every problem: half, never, worse, broken." in text
    alone = comparisons.comparisons_html(comparisons.robust_table(table, "ddp"), None, "ddp", True, ["x", "y"])
    assert "No AlgoPerf score" in alone and "x, y" in alone


def test_the_written_report_ranks_and_writes_speedups(tmp_path: Path) -> None:
    suite = tmp_path / "smoke"
    for seed in (0, 1, 2):  # ddp reaches 0.9 at 2.0 s, qsgd at 1.0 s, on every seed
        write_run(suite, "ddp", DDP, seed, "completed", [(1.0, 0.5), (2.0, 0.93), (3.0, 0.95)])
        write_run(suite, "qsgd", QSGD, seed, "completed", [(0.5, 0.7), (1.0, 0.92), (1.5, 0.94)],
                  sent_per_step=(100, 150))
    index = build.write_report(suite)
    text = index.read_text(encoding="utf-8")
    assert text.index('<section id="rankings">') < text.index("Per label (mean over seeds)")
    assert (f"On digits-mlp, {QSGD} reached the target 0.9 fastest, in 1 s (mean of 3 runs): 2.00x [2.00, 2.00] the "
            f"speed of the baseline {DDP}.") in text
    assert "Few seeds" not in text and "MLPerf time to target (s)" in text
    assert (index.parent / "improvement.png").exists()
    with (index.parent / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:13] == list(tables.SUMMARY_COLUMNS)
    assert list(rows[0])[-3:] == list(rankings.SPEEDUP_COLUMNS)
    assert {row["speedup_vs_baseline"] for row in rows if row["label"] == QSGD} == {"2.0"}
    assert {row["speedup_vs_baseline"] for row in rows if row["label"] == DDP} == {""}
    ranked = pd.read_csv(index.parent / "rankings.csv")
    assert list(ranked.columns) == list(rankings.RANKING_COLUMNS) and ranked["label"].tolist() == [QSGD, DDP]
    assert re.search(r"<th>workload</th>\s*<th>label</th>", text)


def test_plots_facet_by_workload_and_name_what_they_leave_out(tmp_path: Path) -> None:
    import json

    from harness.report import figures, plots
    from harness.results import load_suite

    suite = tmp_path / "two"
    for seed in (0, 1):
        write_run(suite, "ddp", DDP, seed, "completed", [(1.0, 0.5), (2.0, 0.93), (3.0, 0.95)])
        other = write_run(suite, "qsgd", QSGD, seed, "completed" if seed else "diverged", [(10.0, 0.7), (40.0, 0.8)])
        spec = json.loads((other / "spec.json").read_text())
        (other / "spec.json").write_text(json.dumps({**spec, "workload": "digits-cnn"}))
    runs = load_suite(suite)
    table = tables.summary(runs)
    used = table[table["state"] == "completed"]
    fig = figures.plot_accuracy(tables.curves([r for r in runs if r.state == "completed"]), "train time (s)")
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["digits-mlp", "digits-cnn"]
    assert [ax.get_legend_handles_labels()[1] for ax in shown] == [[DDP], [QSGD]]  # each only on its workload
    survival = figures.plot_time_to_target_survival(table, 0.9)
    assert [ax.get_title(loc="left") for ax in survival.axes] == ["digits-mlp: target accuracy 0.9",
                                                                   "digits-cnn: target accuracy 0.9"]
    assert plots.left_out(table, used) == f"Not shown: {QSGD} (seed 0: diverged 1)."
    assert plots.left_out(table, used, "time_to_target_s", "never reached the target") == (
        f"Not shown: {QSGD} (seed 0: diverged 1); {QSGD} (seed 1: never reached the target).")
    page_text = build.write_report(suite).read_text(encoding="utf-8")
    assert (f"Seeds that never arrived: {QSGD} on digits-cnn (0 of 2 reached; 1 missed, 1 diverged).</figcaption>"
            in page_text)  # the diverged seed is drawn (an x), not left out
