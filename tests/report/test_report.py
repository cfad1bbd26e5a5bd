"""Tests of harness/report/ on fake but realistic suite folders: summary, curves, plots, HTML page."""

from __future__ import annotations

import base64
import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.report import build, figures, tables
from harness.results import load_suite

TARGET = 0.9
DDP, QSGD = "ddp x2", "qsgd bits=4 x2"
SIGKILL = "rank 1 was killed by signal SIGKILL"
NAN_LOSS = "loss became nan at step 15 (lr=0.5 > 0.1 & no warmup)"


def write_run(suite_dir: Path, method: str, label: str, seed: int, state: str,
              evals: list[tuple[float, float]], steps: int = 40,
              sent_per_step: tuple[int, int] = (1000, 1500), error: dict | None = None,
              truncated: bool = False, first_eval: bool = True) -> Path:
    """Write one run folder of a 2-rank run: train records every 10 steps from both ranks, rank-0 evals.

    evals: (train_time_s, test_accuracy) per evaluation, one per 10 steps (epoch = evaluation number), after
    one at step 0 (accuracy 0.1) when first_eval.
    Each rank's bytes_sent after step s is sent_per_step[rank] * s; samples after step s are 64 * s (global).
    """
    run_id = f"{method}-digits-mlp-w2-s{seed}"
    run_dir = suite_dir / run_id
    run_dir.mkdir(parents=True)
    spec = {"suite": "smoke", "run_id": run_id, "label": label, "method": method, "family": "data-parallel",
            "workload": "digits-mlp", "workload_options": {}, "world_size": 2, "seed": seed,
            "params": {"batch_size": 32, "lr": 0.05},
            "budget": {"max_epochs": 4, "max_steps": None, "max_train_seconds": None, "eval_every_epochs": 1,
                       "eval_every_seconds": None, "target_accuracy": TARGET},
            "threads_per_rank": 1, "deterministic": True, "log_every_steps": 10, "data_root": None,
            "suite_file": "/x/suites/smoke.toml"}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    status = {"state": state, "error": error, "final": {}, "updated": "2026-11-29T10:00:00Z"}
    (run_dir / "status.json").write_text(json.dumps(status))
    lines = []
    if first_eval:  # the runner evaluates before the first step
        lines.append({"kind": "eval", "rank": 0, "wall_time_s": 0.3, "train_time_s": 0.0, "step": 0,
                      "epoch": 0.0, "samples": 0, "test_accuracy": 0.1, "test_loss": 2.3})
    for index, step in enumerate(range(10, steps + 1, 10)):
        # Train time: eval i ends at evals[i][0]; rank 1 is always a little later than rank 0.
        t0 = evals[index][0] if index < len(evals) else evals[-1][0] + 0.5 * (index - len(evals) + 1)
        for rank in (0, 1):
            lines.append({"kind": "train", "rank": rank, "wall_time_s": t0 + 0.3 * index + 0.05 * rank,
                          "train_time_s": t0 + 0.05 * rank, "step": step, "epoch": (index + 1.0),
                          "samples": 64 * step, "loss": math.nan if state == "diverged" else 1.0 / step,
                          "bytes_sent": sent_per_step[rank] * step, "bytes_recv": sent_per_step[rank] * step,
                          "bytes_by_category": {"gradients": [sent_per_step[rank] * step] * 2}})
        if index < len(evals):
            time, accuracy = evals[index]
            lines.append({"kind": "eval", "rank": 0, "wall_time_s": time + 0.3 * index + 0.2,
                          "train_time_s": time, "step": step, "epoch": index + 1.0, "samples": 64 * step,
                          "test_accuracy": accuracy, "test_loss": 1 - accuracy})
    # A kind the report does not know, with values that would change the summary if it were read.
    lines.append({"kind": "trace", "rank": 0, "wall_time_s": 99.0, "train_time_s": 999.0, "step": 10**6,
                  "samples": "many", "events": [["fwd", 0, 1]]})
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if truncated:
        text += '{"kind": "train", "rank": 1, "wall_time_s": 5.'
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """Two labels x 2 seeds that completed, one failed run (truncated metrics), one diverged run."""
    suite_dir = tmp_path / "smoke"
    # First crossing of 0.9 at 2.0 s; accuracy dips and recovers; final (0.94) is not the best (0.96).
    write_run(suite_dir, "ddp", DDP, 0, "completed", [(1.0, 0.5), (2.0, 0.93), (3.0, 0.96), (4.0, 0.94)])
    write_run(suite_dir, "ddp", DDP, 1, "completed", [(0.9, 0.6), (1.8, 0.88), (2.7, 0.91), (3.6, 0.95)])
    write_run(suite_dir, "qsgd", QSGD, 0, "completed", [(0.5, 0.4), (1.0, 0.7), (1.5, 0.85), (2.0, 0.92)],
              sent_per_step=(100, 150))
    write_run(suite_dir, "qsgd", QSGD, 1, "completed", [(0.6, 0.3), (1.2, 0.6), (1.8, 0.8), (2.4, 0.89)],
              sent_per_step=(100, 150))
    write_run(suite_dir, "ddp", DDP, 2, "failed", [(1.0, 0.55)], steps=20, truncated=True,
              error={"message": SIGKILL, "rank": 1})
    write_run(suite_dir, "qsgd", QSGD, 2, "diverged", [(0.5, 0.1)], steps=20, sent_per_step=(100, 150),
              error={"message": NAN_LOSS, "rank": 0})
    return suite_dir


def load(suite_dir: Path):
    with pytest.warns(UserWarning, match="skipped a corrupt line"):
        return load_suite(suite_dir)


def test_summary_columns_and_values(suite: Path) -> None:
    table = tables.summary(load(suite)).set_index("run_id", drop=False)
    assert list(table.columns) == [*tables.SUMMARY_COLUMNS, "label", "family", "steps", "epochs", "network",
                                   "samples_per_s", "bubble", "peak_activation_bytes", "peak_weight_bytes",
                                   "last_epoch_bytes_per_sample", "cpu_share", "other_load", "noisy",
                                   "peak_rss_bytes", "final_loss", "perplexity", "bytes_per_token",
                                   "tokens_per_s", "memory_per_rank", "planned_memory_bytes", "held_memory_bytes",
                                   "allocator_peak_bytes"]
    assert list(table.columns[:13]) == [
        "suite", "run_id", "method", "workload", "world_size", "seed", "state", "final_accuracy",
        "best_accuracy", "time_to_target_s", "train_time_s", "total_bytes", "bytes_per_sample"]
    assert len(table) == 6
    run = table.loc["ddp-digits-mlp-w2-s0"]
    assert (run.suite, run.method, run.workload, run.world_size, run.seed, run.state, run.label) == (
        "smoke", "ddp", "digits-mlp", 2, 0, "completed", DDP)
    assert run.final_accuracy == pytest.approx(0.94)
    assert run.best_accuracy == pytest.approx(0.96)
    assert run.time_to_target_s == pytest.approx(2.0)  # the first eval with accuracy >= 0.9, not a later one
    assert run.train_time_s == pytest.approx(4.0)  # rank 0 only (rank 1 reached 4.05); trace kind ignored
    assert run.total_bytes == 1000 * 40 + 1500 * 40  # each rank's last bytes_sent, summed
    assert run.bytes_per_sample == pytest.approx((1000 * 40 + 1500 * 40) / (64 * 40))
    assert (run.steps, run.epochs) == (40, 4.0)
    assert table.loc["ddp-digits-mlp-w2-s1", "time_to_target_s"] == pytest.approx(2.7)
    assert math.isnan(table.loc["qsgd-digits-mlp-w2-s1", "time_to_target_s"])  # never reached 0.9
    assert table.loc["qsgd-digits-mlp-w2-s0", "total_bytes"] == 100 * 40 + 150 * 40
    failed = table.loc["ddp-digits-mlp-w2-s2"]
    assert (failed.state, failed.total_bytes, failed.steps) == ("failed", 2500 * 20, 20)
    assert failed.final_accuracy == 0.55
    assert table.loc["qsgd-digits-mlp-w2-s2", "state"] == "diverged"


def test_summary_row_for_run_without_metrics_or_status(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "s", "sgd", "sgd x1", 0, "running", [(1.0, 0.5)])
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "status.json").unlink()
    row = tables.summary(load_suite(tmp_path / "s")).iloc[0]
    assert (row.run_id, row.state, row.total_bytes) == ("sgd-digits-mlp-w2-s0", "unknown", 0)
    for column in ("final_accuracy", "time_to_target_s", "train_time_s", "bytes_per_sample"):
        assert math.isnan(row[column]), column


def test_summary_without_target_has_no_time_to_target(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "s", "ddp", DDP, 0, "completed", [(1.0, 0.95)])
    spec = json.loads((run_dir / "spec.json").read_text())
    spec["budget"]["target_accuracy"] = None
    (run_dir / "spec.json").write_text(json.dumps(spec))
    assert math.isnan(tables.summary(load_suite(tmp_path / "s")).iloc[0]["time_to_target_s"])


def test_label_falls_back_to_method(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "s", "ddp", "", 0, "completed", [(1.0, 0.95)])
    spec = json.loads((run_dir / "spec.json").read_text())
    del spec["label"]
    (run_dir / "spec.json").write_text(json.dumps(spec))
    assert tables.summary(load_suite(tmp_path / "s")).iloc[0]["label"] == "ddp"


def test_curves_share_one_grid_per_label(suite: Path) -> None:
    runs = [run for run in load(suite) if run.state == "completed"]
    table = tables.curves(runs, x="train_time_s", grid_points=50)
    assert list(table.columns) == ["label", "seed", "run_id", "x", "test_accuracy", "workload"]
    assert len(table) == 4 * 50
    for label, final in ((DDP, 3.6), (QSGD, 2.0)):  # the smallest final eval time among the label's seeds
        seeds = [group["x"].to_numpy() for _, group in table[table["label"] == label].groupby("seed")]
        assert len(seeds) == 2
        np.testing.assert_array_equal(seeds[0], seeds[1])
        assert seeds[0][0] == 0.0 and seeds[0][-1] == pytest.approx(final) and len(seeds[0]) == 50
    ddp0 = table[table["run_id"] == "ddp-digits-mlp-w2-s0"]
    expected = np.interp(ddp0["x"], [0.0, 1.0, 2.0, 3.0, 4.0], [0.1, 0.5, 0.93, 0.96, 0.94])
    np.testing.assert_allclose(ddp0["test_accuracy"], expected)
    assert table["test_accuracy"].notna().all()


def test_curves_without_step0_eval_start_where_every_seed_has_values(tmp_path: Path) -> None:
    write_run(tmp_path / "s", "ddp", DDP, 0, "completed", [(1.0, 0.5), (2.0, 0.9)], steps=20, first_eval=False)
    write_run(tmp_path / "s", "ddp", DDP, 1, "completed", [(1.5, 0.6), (2.5, 0.8)], steps=20, first_eval=False)
    write_run(tmp_path / "s", "sgd", "sgd x1", 0, "completed", [(3.0, 0.5), (4.0, 0.9)], steps=20,
              first_eval=False)
    write_run(tmp_path / "s", "sgd", "sgd x1", 1, "completed", [(5.0, 0.6), (6.0, 0.8)], steps=20,
              first_eval=False)  # does not overlap seed 0: NaN before its first evaluation, no extrapolation
    table = tables.curves(load_suite(tmp_path / "s"), grid_points=11)
    ddp = table[table["label"] == DDP]
    np.testing.assert_allclose(ddp["x"].iloc[:11], np.linspace(1.5, 2.0, 11))
    assert ddp["test_accuracy"].notna().all()
    sgd1 = table[table["run_id"] == "sgd-digits-mlp-w2-s1"]
    np.testing.assert_allclose(sgd1["x"], np.linspace(0.0, 4.0, 11))
    assert sgd1["test_accuracy"].isna().all()


def test_curves_by_epoch_and_bad_axis(suite: Path) -> None:
    runs = [run for run in load(suite) if run.state == "completed"]
    table = tables.curves(runs, x="epoch", grid_points=5)
    assert table["x"].max() == pytest.approx(4.0)
    assert table[table["run_id"] == "ddp-digits-mlp-w2-s0"]["test_accuracy"].iloc[-1] == pytest.approx(0.94)
    with pytest.raises(ValueError, match="x must be one of"):
        tables.curves(runs, x="wall_time_s")


def test_aggregate_mean_and_ci(suite: Path) -> None:
    aggregates = tables.aggregate(tables.summary(load(suite))).set_index("label")
    ddp = aggregates.loc[DDP]
    assert (ddp.runs, ddp.completed, ddp.used, ddp.family) == (3, 2, 2, "data-parallel")  # failed: not averaged
    assert ddp.final_accuracy_mean == pytest.approx((0.94 + 0.95) / 2)
    # the bootstrap means of two values are 0.94, 0.945 and 0.95: the 95% interval spans the two values
    assert (ddp.final_accuracy_ci_low, ddp.final_accuracy_ci_high) == pytest.approx((0.94, 0.95))
    assert aggregates.loc[QSGD, "time_to_target_s_n"] == 1  # one of two completed seeds reached the target


def test_time_to_target_survival_marks_the_seeds_that_never_arrived(suite: Path) -> None:
    from harness.report import plots

    table = tables.summary(load(suite))
    fig = figures.plot_time_to_target_survival(table, TARGET)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_ylabel() == "fraction of seeds\nat target"
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    # ddp: 2.0 and 2.7 s, its failed seed left out -> steps to 1/2 and 1. qsgd: seed 0 at 2.0 s, seed 1 missed
    # (censored at its 2.4 s), seed 2 diverged at 1.0 s (never reaches: it stays at risk) -> 1/3, ending on a tick.
    assert lines[DDP].get_ydata().tolist() == pytest.approx([0, 0.5, 1, 1])
    assert lines[QSGD].get_xdata()[-1] == pytest.approx(2.4)
    assert lines[QSGD].get_ydata().tolist() == pytest.approx([0, 1 / 3, 1 / 3])
    marks = sorted((line.get_marker(), float(line.get_xdata()[0]), float(line.get_ydata()[0]))
                   for line in ax.get_lines() if line.get_label().startswith("_"))
    assert marks == [("x", 1.0, 0.0), ("|", 2.4, pytest.approx(1 / 3))]
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend == [DDP, QSGD, *(words for _, words in figures.CENSOR_MARKS.values())]
    caption = plots.survival_caption(table)
    assert f"Seeds that never arrived: {QSGD} (1 of 3 reached; 1 missed, 1 diverged)." in caption
    assert caption.endswith(f"Not shown: {DDP} (seed 2: failed 1).") and "marked x" in caption


def test_bytes_plot_uses_log_scale_only_for_wide_spans(suite: Path) -> None:
    table = tables.summary(load(suite))
    assert figures.plot_bytes_per_sample(table).axes[0].get_xscale() == "linear"  # 39 vs 3.9 bytes/sample
    table.loc[table["label"] == QSGD, "bytes_per_sample"] /= 100
    assert figures.plot_bytes_per_sample(table).axes[0].get_xscale() == "log"


def test_write_report_files_and_self_contained_html(suite: Path) -> None:
    with pytest.warns(UserWarning, match="skipped a corrupt line"):
        index = build.write_report(suite)
    out = suite / "report"
    assert index == out / "index.html"
    for name in ("index.html", "summary.csv", "comparisons.csv", "accuracy_vs_time.png", "accuracy_vs_epoch.png",
                 "time_to_target_survival.png", "bytes_per_sample.png", "rankings.csv"):
        assert (out / name).stat().st_size > 0, name
        if name.endswith(".png"):
            assert (out / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:13] == list(tables.SUMMARY_COLUMNS) and len(rows) == 6
    never = next(row for row in rows if row["run_id"] == "qsgd-digits-mlp-w2-s1")
    assert never["time_to_target_s"] == ""  # empty when never reached

    page = index.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert not (out / "improvement.png").exists()  # 2 seeds a label: P(improvement) says nothing
    assert "Few seeds" in page and "MLPerf time to target (s)" not in page
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(sources) == len(list(out.glob("*.png")))
    for source in sources:
        prefix = "data:image/png;base64,"
        assert source.startswith(prefix)
        assert base64.b64decode(source[len(prefix):]).startswith(b"\x89PNG")
    assert "smoke" in page and "Generated " in page
    assert SIGKILL in page and "rank 1" in page
    assert "loss became nan at step 15 (lr=0.5 &gt; 0.1 &amp; no warmup)" in page  # escaped
    assert "0.1 & no" not in page
    assert "0.945 [0.94, 0.95] (n=2)" in page  # DDP's final accuracy: mean [bootstrap interval] over 2 seeds
    # 2 seeds a label: one kind of interval, named once, and never called a 95% CI; the order is no finding
    assert "percentile bootstrap over seeds" in page and "±" not in page
    assert "no confidence interval" in page and "min–max of 2 seeds" in page
    assert "95% CI" not in page and "95% bootstrap interval" not in page and "Not significant." in page
    assert "Robust comparisons" in page and "Noisy measurements" not in page  # fake runs have no cpu records


def test_write_report_to_another_folder_with_no_completed_run(tmp_path: Path) -> None:
    suite = tmp_path / "s"
    write_run(suite, "ddp", DDP, 0, "failed", [(1.0, 0.5)], error={"message": SIGKILL, "rank": 1})
    index = build.write_report(suite, tmp_path / "elsewhere")
    assert index == tmp_path / "elsewhere" / "index.html" and index.exists()
    assert not (suite / "report").exists()
    assert (tmp_path / "elsewhere" / "summary.csv").exists()
    assert "No run completed: aggregates and plots use every run." in index.read_text(encoding="utf-8")


def test_report_on_empty_folder_raises(tmp_path: Path) -> None:
    (tmp_path / "empty" / "not-a-run").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"empty: no runs found \(no \*/spec.json\)"):
        build.write_report(tmp_path / "empty")


def test_plots_have_titles_and_axis_labels(suite: Path) -> None:
    runs = [run for run in load(suite) if run.state == "completed"]
    fig = figures.plot_accuracy(tables.curves(runs), "train time (s)", TARGET)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("train time (s)", "test accuracy")
    assert "on digits-mlp" in fig.get_suptitle() and len(ax.get_lines()) >= 2
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [DDP, QSGD, "target 0.9"]  # outside the axes
    assert figures.plot_accuracy(pd.DataFrame(columns=list(tables.CURVE_COLUMNS)), "epoch").axes[0].texts


def test_the_baseline_is_ddp_by_default_named_on_the_page_and_chosen_by_label(suite: Path, tmp_path: Path) -> None:
    table = tables.summary(load(suite))
    assert build.choose_baseline(table) == (DDP, "default: the first ddp label")
    assert build.choose_baseline(table, QSGD) == (QSGD, "--baseline")
    assert build.choose_baseline(table[table["method"] == "qsgd"]) == (QSGD, "default: no ddp run, so the first "
                                                                             "run's label")
    with pytest.raises(ValueError, match=r"--baseline 'sgd x1': no run has that label \(labels: ddp x2, qsgd"):
        build.choose_baseline(table, "sgd x1")
    with pytest.warns(UserWarning, match="skipped a corrupt line"):
        page = build.write_report(suite, baseline=QSGD).read_text()
    assert f"Baseline for comparisons: <b>{QSGD}</b> (--baseline)." in page


def test_report_cli_with_an_unknown_baseline_exits_2_and_writes_nothing(suite: Path, capsys) -> None:
    from harness.cli import main

    with pytest.warns(UserWarning, match="skipped a corrupt line"):
        assert main(["report", str(suite), "--baseline", "nope"]) == 2
    assert "no run has that label" in capsys.readouterr().err and not (suite / "report").exists()
