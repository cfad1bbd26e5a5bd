"""Q-FB end to end: the CLI on 2 ranks, both lanes in the trace records, trace.json and the Gantt chart."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.report import pipeline
from harness.results import RunResult, load_run, metrics_frame, read_jsonl

SUITE = """name = "qfb"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 2
[budget]
max_steps = 6
eval_every_epochs = 0.1
[defaults]
batch_size = 32
lr = 0.05
[[run]]
method = "qfb"
world_size = 2
params = { microbatches = 4, trace_steps = 3 }
[[run]]
method = "qfb"
world_size = 2
params = { microbatches = 4, sync = "bounded", trace_steps = 3 }
"""


def test_the_gantt_chart_has_a_row_per_rank_and_lane():
    lane0 = [["forward", 0, 0, 1, 0, 0, 0, 0], ["forward", 1, 1, 2, 0, 0, 0, 0]]
    lane1 = [["backward", 0, 1.5, 3, 0, 0, 0, 1], ["update", -1, 3, 3.2, -1, 0, 0, 1]]
    last = [["forward", 0, 1, 1.2, 0, 1, 0, 0], ["backward", 0, 1.2, 1.5, 0, 1, 0, 1]]
    records = [{"kind": "trace", "rank": 0, "step": 1, "worker": 0, "events": lane0 + lane1},
               {"kind": "trace", "rank": 1, "step": 1, "worker": 1, "events": last}]
    run = RunResult(Path("qfb"), {"method": "qfb", "world_size": 2, "seed": 0,
                                  "params": {"microbatches": 2, "lanes": 2}}, None, None, metrics_frame(records))
    figure = pipeline.plot_gantt(run)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["rank 0 lane 0", "rank 0 lane 1", "rank 1 lane 0", "rank 1 lane 1"]
    assert "ideal" not in figure.axes[0].get_title()  # no closed form with lanes


@pytest.mark.slow
def test_qfb_suite_end_to_end(tmp_path, dtbench_here):
    path = tmp_path / "qfb.toml"
    path.write_text(SUITE)
    out = tmp_path / "out"
    proc = dtbench_here("run", str(path), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dirs = sorted((out / "qfb").glob("qfb-*"))
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        records = read_jsonl(run_dir / "metrics.jsonl")
        assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
        assert {r["worker"] for r in records if r["kind"] == "trace"} == {0, 1}
        trace = json.loads((run_dir / "trace.json").read_text())
        names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
        assert {"stage 0", "stage 0 lane 1", "stage 1", "stage 1 lane 1"} <= names
        evals = [r for r in records if r["kind"] == "eval"]
        assert evals[-1]["test_accuracy"] > 0.1
        labels = [t.get_text() for t in pipeline.plot_gantt(load_run(run_dir)).axes[0].get_yticklabels()]
        assert labels == ["rank 0 lane 0", "rank 0 lane 1", "rank 1 lane 0", "rank 1 lane 1"]
    proc = dtbench_here("report", str(out / "qfb"))
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "qfb" / "report" / "summary.csv")
    assert set(table["state"]) == {"completed"}
    weights = table.set_index("run_id")["peak_weight_bytes"]
    assert weights[[i for i in weights.index if "bounded" not in i][0]] == 0  # exact: shared weights, no copy
    assert weights[[i for i in weights.index if "bounded" in i][0]] > 0  # bounded: the open window's copy
