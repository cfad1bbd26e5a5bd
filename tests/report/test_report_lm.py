"""A language model is read by its loss everywhere on the page: rankings and per-label tables lead with held-out
loss and perplexity and have no accuracy column, held-out loss is plotted against train time and tokens, time to
target names a target loss, and summary.csv gives tokens per second; a workload beside it keeps its accuracy."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.report import build, tables
from harness.results import load_suite

CONTEXT = 32
TARGET_LOSS = 2.9


def write_lm_run(suite_dir: Path, method: str, label: str, seed: int, losses: list[tuple[float, float]],
                 workload: str = "shakespeare-gpt") -> None:
    """One 2-rank GPT run: (train_time_s, held-out loss) per evaluation every 10 steps of 16 windows of CONTEXT
    tokens, after one at step 0; next-token accuracy 0.25 throughout (what a char model's looks like early)."""
    run_id = f"{label.replace(' ', '_')}-s{seed}"
    run_dir = suite_dir / run_id
    run_dir.mkdir(parents=True)
    spec = {"suite": "mix", "run_id": run_id, "label": label, "method": method, "family": "data-parallel",
            "workload": workload, "workload_options": {"context": CONTEXT}, "world_size": 2, "seed": seed,
            "params": {"batch_size": 16}, "budget": {"max_steps": 10 * len(losses), "target_loss": TARGET_LOSS},
            "suite_file": "/x/suites/mix.toml"}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    (run_dir / "status.json").write_text(json.dumps({"state": "completed", "error": None, "final": {}}))
    lines = [{"kind": "eval", "rank": 0, "wall_time_s": 0.1, "train_time_s": 0.0, "step": 0, "epoch": 0.0,
              "samples": 0, "test_accuracy": 0.25, "test_loss": 4.4}]
    for index, (time, loss) in enumerate(losses):
        step = 10 * (index + 1)
        for rank in (0, 1):
            lines.append({"kind": "train", "rank": rank, "wall_time_s": time, "train_time_s": time, "step": step,
                          "epoch": step * 16 / 284_280, "samples": 16 * step, "loss": loss,
                          "bytes_sent": 1000 * step, "bytes_recv": 1000 * step})
        lines.append({"kind": "eval", "rank": 0, "wall_time_s": time + 0.1, "train_time_s": time, "step": step,
                      "epoch": step * 16 / 284_280, "samples": 16 * step, "test_accuracy": 0.25, "test_loss": loss})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture
def lm_suite(tmp_path: Path) -> Path:
    suite_dir = tmp_path / "results" / "mix"
    for seed in range(3):
        write_lm_run(suite_dir, "sgd", "sgd lm", seed, [(1.0, 3.5), (2.0, 3.0), (3.0, 2.8)])
        write_lm_run(suite_dir, "ddp", "ddp lm", seed, [(2.0, 3.4), (4.0, 2.95), (6.0, 2.7)])
    return suite_dir


def test_a_loss_workload_is_read_by_its_loss(lm_suite: Path) -> None:
    runs = load_suite(lm_suite)
    assert tables.readings(runs) == {"shakespeare-gpt": "loss"}
    for seed in range(3):  # a schedule of ddp's very updates: the same losses on every seed, at other times
        write_lm_run(lm_suite, "gpipe", "gpipe lm", seed, [(3.0, 3.4), (5.0, 2.95), (7.0, 2.7)])
    index = build.write_report(lm_suite)
    page = index.read_text(encoding="utf-8")
    # The tie is said where it shows: under the per-label table and under the workload's comparison table.
    note = "Identical on every seed:</b> ddp lm, gpipe lm (final accuracy and held-out loss equal to within 1e-06"
    assert page.count(note) == 2 and "<b>On shakespeare-gpt: Identical on every seed:</b>" in page
    assert page.index(note) > page.index('<section id="per-label">') and page.rindex(note) > page.index(
        '<section id="comparisons">')
    rankings = page[page.index('<section id="rankings">'):page.index('<section id="per-label">')]
    per_label = page[page.index('<section id="per-label">'):page.index("</section>", page.index('id="per-label"'))]
    for section in (rankings, per_label):
        table = "".join(re.findall(r"<table.*?</table>", section, re.S))
        assert "held-out loss" in table and "perplexity" in table and "accuracy" not in table
    assert "target loss 2.9" in rankings and "0.25" not in rankings  # no next-token accuracy anywhere
    assert "tokens / s" in rankings and "bytes / token" in rankings
    out = index.parent
    assert (out / "heldout_loss_vs_time.png").exists() and (out / "heldout_loss_vs_tokens.png").exists()
    assert not (out / "accuracy_vs_epoch.png").exists() and not (out / "accuracy_vs_time.png").exists()
    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    sgd = next(row for row in rows if row["label"] == "sgd lm")
    assert float(sgd["tokens_per_s"]) == pytest.approx(16 * 30 * CONTEXT / 3.0)  # 480 windows of 32 tokens in 3 s
    assert float(sgd["samples_per_s"]) == pytest.approx(16 * 30 / 3.0)


def test_the_loss_curves_run_against_tokens(lm_suite: Path) -> None:
    curve = tables.curves(load_suite(lm_suite), "tokens", y="test_loss")
    assert curve["x"].max() == pytest.approx(16 * 30 * CONTEXT)
    assert set(curve.columns) >= {"label", "x", "test_loss", "workload"}


def test_a_workload_beside_it_keeps_its_accuracy(lm_suite: Path) -> None:
    from test_report import write_run  # a digits-mlp run with a target accuracy

    for seed in range(3):
        write_run(lm_suite, "ddp", "ddp x2", seed, "completed", [(1.0, 0.5), (2.0, 0.93), (3.0, 0.95)])
    page = build.write_report(lm_suite).read_text(encoding="utf-8")
    per_label = page[page.index('<section id="per-label">'):]
    assert "<h3>Read by accuracy</h3>" in per_label and "<h3>Read by held-out loss (language models)</h3>" in per_label
    accuracy_part = per_label[per_label.index("Read by accuracy"):per_label.index("Read by held-out loss")]
    assert "final accuracy" in accuracy_part and "digits-mlp" in accuracy_part
    assert "shakespeare-gpt" not in accuracy_part
    assert "On digits-mlp, only ddp x2 ran: nothing to compare; it reached the target 0.9 in" in page  # no winner
    out = lm_suite / "report"
    assert (out / "accuracy_vs_epoch.png").exists() and (out / "heldout_loss_vs_time.png").exists()
    # The robust comparisons read each workload by its own quality: the GPT labels by held-out loss (2.8 and 2.7
    # at the end), the digits label by accuracy, and neither by the other's.
    robust = pd.read_csv(out / "comparisons.csv").set_index("label")
    assert robust.loc["sgd lm", "iqm_final_loss"] == pytest.approx(2.8)
    assert math.isnan(robust.loc["sgd lm", "iqm_final_accuracy"])
    assert robust.loc["ddp x2", "iqm_final_accuracy"] == pytest.approx(0.95)
    assert math.isnan(robust.loc["ddp x2", "iqm_final_loss"])
    comparisons = page[page.index("<h2>Robust comparisons</h2>"):]
    comparisons = comparisons[:comparisons.index("<h2", 5)]
    assert "IQM held-out loss" in comparisons and "0.25" not in comparisons  # the GPT's next-token accuracy


def test_throughput_is_in_tokens_for_a_language_model(lm_suite: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from harness.report.resources import plot_throughput

    table = tables.summary(load_suite(lm_suite))
    fig = plot_throughput(table, per_token={"shakespeare-gpt"})
    assert fig.axes[0].get_xlabel() == "tokens / s"
    assert plot_throughput(table).axes[0].get_xlabel() == "samples / s"
