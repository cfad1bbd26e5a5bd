"""The report's robust comparisons (IQM, probability of improvement, AlgoPerf, MLPerf), family styles, and the
measurement-hygiene verdicts from `cpu` records."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest

from harness.report import build, comparisons, hygiene, styles
from harness.run.usage import UsageSample, run_queue_wait_s, usage_record


def summary_rows(rows: list[tuple]) -> pd.DataFrame:
    """(label, method, family, workload, seed, final_accuracy, time_to_target_s) -> a summary-like table."""
    table = pd.DataFrame(rows, columns=["label", "method", "family", "workload", "seed", "final_accuracy",
                                        "time_to_target_s"])
    return table.assign(network="", state="completed", suite="s")


@pytest.fixture
def table() -> pd.DataFrame:
    rows = []
    for seed in range(4):
        rows.append(("ddp x2", "ddp", "data-parallel", "a", seed, 0.90, 10.0 + seed))
        rows.append(("dgc x2", "dgc", "data-parallel-compressed", "a", seed, 0.91, 5.0 + seed))
        rows.append(("qsgd x2", "qsgd", "data-parallel-compressed", "a", seed, 0.80, math.nan if seed else 30.0))
        rows.append(("ddp x2", "ddp", "data-parallel", "b", seed, 0.70, 20.0))
        rows.append(("dgc x2", "dgc", "data-parallel-compressed", "b", seed, 0.60, 40.0))
        rows.append(("qsgd x2", "qsgd", "data-parallel-compressed", "b", seed, 0.65, 80.0))
    return summary_rows(rows)


def test_robust_table_compares_within_each_workload(table: pd.DataFrame) -> None:
    robust = comparisons.robust_table(table, "ddp x2")
    # One row per workload and label: nothing is pooled across the two workloads.
    assert list(zip(robust["workload"], robust["label"], strict=True)) == [
        ("a", "ddp x2"), ("a", "dgc x2"), ("a", "qsgd x2"), ("b", "ddp x2"), ("b", "dgc x2"), ("b", "qsgd x2")]
    robust = robust.set_index(["workload", "label"])
    # dgc: accuracy 0.91 on a always beats ddp's 0.90, and 0.60 on b always loses to its 0.70
    assert robust.loc[("a", "dgc x2"), "poi_final_accuracy"] == pytest.approx(1.0)
    assert robust.loc[("b", "dgc x2"), "poi_final_accuracy"] == pytest.approx(0.0)
    # time: dgc 5..8 s vs ddp 10..13 s on a (always faster), 40 vs 20 on b (always slower)
    assert robust.loc[("a", "dgc x2"), "poi_time_to_target_s"] == pytest.approx(1.0)
    assert robust.loc[("b", "dgc x2"), "poi_time_to_target_s"] == pytest.approx(0.0)
    # qsgd misses the target in 3 of 4 runs on a: a miss is infinitely slow, and ties with nothing
    assert robust.loc[("a", "qsgd x2"), "poi_time_to_target_s"] == pytest.approx(0.0)
    assert math.isnan(robust.loc[("a", "ddp x2"), "poi_final_accuracy"])  # the baseline is not compared with itself
    assert robust.loc[("a", "ddp x2"), "iqm_final_accuracy"] == pytest.approx(0.9)  # a's runs alone, not b's 0.7
    low, high = robust.loc[("a", "ddp x2"), ["iqm_final_accuracy_low", "iqm_final_accuracy_high"]]
    assert low == high == pytest.approx(0.9)
    assert robust.loc[("a", "ddp x2"), "mlperf_time_to_target_s"] == pytest.approx(11.5)  # mean of 11 and 12
    assert robust.loc[("b", "ddp x2"), "mlperf_time_to_target_s"] == pytest.approx(20.0)
    assert math.isnan(robust.loc[("a", "qsgd x2"), "mlperf_time_to_target_s"])  # three misses


def test_algoperf_scores_over_workloads_and_seeds(table: pd.DataFrame) -> None:
    scores, profile = comparisons.algoperf(table)
    scores = scores.set_index("label")
    assert scores["problems"].unique().tolist() == [8] and scores.loc["qsgd x2", "solved"] == 5
    # ddp on a: ratio (10+s)/(5+s) per seed; on b: 1 (the fastest)
    ddp_a = [(4 - (10 + s) / (5 + s)) / 3 for s in range(4)]
    assert scores.loc["ddp x2", "score"] == pytest.approx((sum(ddp_a) + 4) / 8)
    assert profile[(profile["label"] == "dgc x2") & (profile["tau"] == 1.0)]["rho"].item() == pytest.approx(0.5)


def test_improvement_plot_and_profile_plot_render(table: pd.DataFrame) -> None:
    from harness.report import figures

    robust = comparisons.robust_table(table, "ddp x2")
    long = comparisons.improvement_long(robust)
    assert set(long["label"]) == {"dgc x2", "qsgd x2"}
    fig = figures.plot_improvement(long, "ddp x2")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["dgc x2 on a", "qsgd x2 on a", "dgc x2 on b",
                                                                      "qsgd x2 on b"]
    alone = figures.plot_improvement(long[long["workload"] == "a"], "ddp x2")
    assert [t.get_text() for t in alone.axes[0].get_yticklabels()] == ["dgc x2", "qsgd x2"]
    _, profile = comparisons.algoperf(table)
    assert len(figures.plot_performance_profile(profile).axes[0].get_lines()) == 3


def test_family_colours_and_dashes() -> None:
    frame = pd.DataFrame({"label": ["sgd", "ddp", "qsgd", "dgc", "terngrad", "gpipe", "1f1b", "ddp"],
                          "family": ["reference", "data-parallel", "data-parallel-compressed",
                                     "data-parallel-compressed", "data-parallel-compressed", "pipeline", "pipeline",
                                     "data-parallel"]})
    look = styles.label_styles(frame)
    assert list(look) == ["sgd", "ddp", "qsgd", "dgc", "terngrad", "gpipe", "1f1b"]
    compressed = [look[k] for k in ("qsgd", "dgc", "terngrad")]
    assert len({s.dashes for s in compressed}) == 3 and len({s.color for s in compressed}) == 3
    orange = [s.color for s in compressed]
    assert all(r > b for r, _, b in orange)  # the compressed family is orange: red over blue
    assert look["gpipe"].color[1] > look["gpipe"].color[0]  # pipelines are green
    assert look["gpipe"].dashes != look["1f1b"].dashes
    assert look["sgd"].color[0] == look["sgd"].color[1] == look["sgd"].color[2]  # the reference is grey


def test_sixteen_labels_get_sixteen_colours_clearly_apart() -> None:
    import itertools

    families = (["reference"] + ["data-parallel"] + ["data-parallel-compressed"] * 6 + ["pipeline"] * 7
                + ["local"])
    frame = pd.DataFrame({"label": [f"m{i}" for i in range(16)], "family": families})
    colours = [np.array(style.color) for style in styles.label_styles(frame).values()]
    assert len(colours) == 16
    closest = min(np.linalg.norm(a - b) for a, b in itertools.combinations(colours, 2))
    assert closest >= 0.15, closest  # RGB in [0, 1]: the old shades of one green were 0.03 apart


def cpu_record(rank: int, cpu: float, wait: float | None, busy: float | None, host: str = "h",
               wall: float = 2.0, threads: int = 1) -> dict:
    return {"kind": "cpu", "rank": rank, "cpu_s": cpu, "wait_s": wait, "wall_s": wall, "threads": threads,
            "host": host, "cores": 2, "machine_busy_s": busy, "machine_steal_s": 0.0}


@pytest.mark.parametrize(("records", "noisy"), [
    # quiet: the ranks wait on each other's threads (self-contention), but nothing else runs
    ([cpu_record(0, 1.3, 0.7, 2.7), cpu_record(1, 1.3, 0.7, None)], False),
    # another process took 1.2 of the 4 core-seconds while the ranks waited
    ([cpu_record(0, 1.0, 1.0, 3.2), cpu_record(1, 1.0, 1.0, None)], True),
    # another process used the other core, but the rank was never starved
    ([cpu_record(0, 2.0, 0.0, 4.0)], False),
    # no schedstat: cpu / (wall · threads) instead, with the machine busy
    ([cpu_record(0, 0.5, None, 3.0, threads=2, wall=1.0)], True),
    # two hosts: each host's machine reading against its own ranks
    ([cpu_record(0, 1.0, 1.0, 1.05, host="a"), cpu_record(1, 1.0, 1.0, 3.0, host="b")], True),
])
def test_noisy_needs_a_starved_rank_and_a_busy_machine(records: list[dict], noisy: bool) -> None:
    verdict = hygiene.run_hygiene(pd.DataFrame(records))
    assert verdict["noisy"] is noisy
    assert hygiene.run_hygiene(pd.DataFrame({"kind": ["train"], "rank": [0]}))["noisy"] is None


def test_usage_records_measure_this_process() -> None:
    start = UsageSample.now()
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:
        pass
    record = usage_record(start, UsageSample.now(), threads=1)
    assert record["wall_s"] >= 0.2 and 0 < record["cpu_s"] <= record["wall_s"] * 1.5
    assert record["cores"] >= 1 and record["host"]
    if run_queue_wait_s() is not None:  # Linux with schedstat
        assert record["wait_s"] >= 0 and record["machine_busy_s"] >= 0
    share = hygiene.cpu_share(pd.Series(record))
    assert 0 < share <= 1.0 + 1e-6
    if record["peak_rss_bytes"] is not None:  # a POSIX system
        assert record["peak_rss_bytes"] > 10 * 2**20


def test_peak_rss_sees_memory_the_process_touched() -> None:
    import subprocess
    import sys

    probe = ("from harness.run.usage import peak_rss_bytes as p; before = p(); block = bytearray(256 * 2**20); "
             "block[::4096] = b'\\x01' * len(range(0, len(block), 4096)); print(before, p())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    before, after = (int(v) for v in done.stdout.split())
    assert after >= max(before, 256 * 2**20)  # the peak holds the 256 MiB the process wrote, at least


def test_a_report_over_two_workloads_has_a_performance_profile(tmp_path) -> None:
    import json

    for workload in ("a", "b"):
        for seed in range(3):
            for method, seconds in (("ddp", 2.0), ("dgc", 1.0 if workload == "a" else 3.0)):
                run_dir = tmp_path / "s" / f"{method}-{workload}-{seed}"
                run_dir.mkdir(parents=True)
                spec = {"suite": "s", "run_id": run_dir.name, "label": f"{method} x2", "method": method,
                        "family": "data-parallel", "workload": workload, "seed": seed, "world_size": 2,
                        "budget": {"target_accuracy": 0.5}}
                (run_dir / "spec.json").write_text(json.dumps(spec))
                (run_dir / "status.json").write_text(json.dumps({"state": "completed"}))
                evals = [{"kind": "eval", "rank": 0, "train_time_s": t, "step": s, "epoch": s, "test_accuracy": a}
                         for s, (t, a) in enumerate([(0.0, 0.1), (seconds, 0.6)])]
                (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    index = build.write_report(tmp_path / "s")
    assert (index.parent / "performance_profile.png").exists()
    page = index.read_text()
    assert "AlgoPerf score" in page and "over 6 problems" in page
    frame = pd.read_csv(index.parent / "comparisons.csv").set_index(["workload", "label"])
    assert np.isclose(frame.loc[("a", "dgc x2"), "poi_time_to_target_s"], 1.0)  # 1 s against ddp's 2 s
    assert np.isclose(frame.loc[("b", "dgc x2"), "poi_time_to_target_s"], 0.0)  # 3 s against 2 s


def test_the_robust_table_names_each_labels_workload_and_the_algoperf_note_does_not_list_every_label() -> None:
    from harness.report.comparisons import comparisons_html, covering, robust_table

    rows = [{"label": label, "method": label.split()[0], "workload": workload, "network": "", "seed": seed,
             "state": "completed", "time_to_target_s": 1.0 + seed, "final_accuracy": 0.9}
            for workload, labels in (("digits-mlp", ("sgd x1", "ddp x2")), ("shakespeare-gpt", ("sgd lm", "ddp lm")))
            for label in labels for seed in range(3)]
    table = pd.DataFrame(rows)
    robust = robust_table(table, "ddp x2")
    assert dict(zip(robust["label"], robust["workload"], strict=True)) == {
        "sgd x1": "digits-mlp", "ddp x2": "digits-mlp", "sgd lm": "shakespeare-gpt", "ddp lm": "shakespeare-gpt"}
    _, left_out, _ = covering(table)
    page = comparisons_html(robust, None, "ddp x2", left_out=left_out)
    assert "<h3>digits-mlp</h3>" in page and "<h3>shakespeare-gpt</h3>" in page  # a table per workload
    assert "Each of the 4 labels ran on only some of the 2 workloads&#x27; problems." in page
    assert "Left out" not in page


@pytest.mark.parametrize(("few_seeds", "has_target"), [(False, True), (True, True), (False, False)])
def test_the_comparisons_prose_names_only_columns_its_tables_have(table: pd.DataFrame, few_seeds: bool,
                                                                  has_target: bool) -> None:
    """Every column the section's prose describes is a header of one of its tables, and every header but the label
    is described; a probability of improvement or MLPerf column that few seeds hide is not described either."""
    import html
    import re

    robust = comparisons.robust_table(table, "ddp x2", has_target)
    text = comparisons.comparisons_html(robust, None, "ddp x2", few_seeds)
    prose = text[:text.index("<table")]
    named = {html.unescape(n) for n in re.findall(r'<b class="column">(.*?)</b>', prose)}
    headers = {html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", text)}
    assert named and named <= headers, named - headers
    assert headers - {"label"} <= named, headers - named
    assert ("P(" in prose) is not few_seeds and ("MLPerf" in prose) is (not few_seeds and has_target)
    assert ("time to target" in prose) is has_target
    assert text.count("<table") == 2 and "<h3>a</h3>" in text and "nothing is averaged across workloads" in text


def test_labels_identical_on_every_seed_get_a_note_at_their_workloads_table(table: pd.DataFrame) -> None:
    # A GPT whose sgd, ddp and gpipe follow one trajectory (the same loss on each seed, to float noise), and a
    # label that differs on one seed only.
    losses = {0: 2.71, 1: 2.74, 2: 2.69}
    rows = [{"label": label, "method": label.split()[0], "family": "f", "workload": "gpt", "network": "",
             "seed": seed, "state": "completed", "time_to_target_s": t, "final_accuracy": 0.3,
             "final_loss": loss * (1 + 1e-9 * k) + (0.01 if label == "near x2" and seed == 2 else 0.0)}
            for k, (label, t) in enumerate((("sgd x1", 9.0), ("ddp x2", 5.0), ("gpipe x2", 6.0), ("near x2", 5.0)))
            for seed, loss in losses.items()]
    both = pd.concat([table.assign(final_loss=1.0 - table["final_accuracy"]), pd.DataFrame(rows)],
                     ignore_index=True)
    identical = comparisons.identical_labels(both)
    assert identical == {"gpt": [(["sgd x1", "ddp x2", "gpipe x2"], 3)]}  # a and b have no tie; near differs once
    assert comparisons.identical_labels(both[~((both["label"] == "ddp x2") & (both["seed"] == 2))]) == {
        "gpt": [(["sgd x1", "gpipe x2"], 3)]}  # ddp has other seeds now: not the same evidence
    robust = comparisons.robust_table(both, {"a": "ddp x2", "b": "ddp x2", "gpt": "ddp x2"}, readings={"gpt": "loss"})
    text = comparisons.comparisons_html(robust, None, {"a": "ddp x2", "b": "ddp x2", "gpt": "ddp x2"},
                                        identical=identical)
    gpt = text[text.index("<h3>gpt</h3>"):]
    assert "<b>Identical on every seed:</b> sgd x1, ddp x2, gpipe x2 (final accuracy and held-out loss equal to " \
           "within 1e-06 relative on each of 3 seeds)" in gpt
    assert text.count('class="identical"') == 1 and "IQM held-out loss" in gpt and "IQM final accuracy" not in gpt
