"""Pipeline runs end to end: the CLI, the drain before the final evaluation, partition.json, traces, the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from harness.report import figures, pipeline
from harness.report.pipeline import measured_bubble, traced_steps
from harness.results import RunResult, metrics_frame, read_jsonl

SUITE = """name = "pipes"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 1
[budget]
max_steps = 7
eval_every_epochs = 0.1
[defaults]
batch_size = 32
lr = 0.05
[[run]]
method = "gpipe"
world_size = 2
params = { microbatches = 4, trace_steps = 3 }
[[run]]
method = "pipedream"
world_size = 2
params = { trace_steps = 3 }
"""


def _run(name: str, stages: int, events: list[list], world_size: int = 2) -> RunResult:
    records = [{"kind": "trace", "rank": s, "step": 1, "stage": s, "events": e} for s, e in enumerate(events)]
    records.append({"kind": "trace", "rank": 0, "step": "junk", "stage": 0, "events": []})  # loses only itself
    return RunResult(Path(name), {"method": name, "world_size": world_size, "seed": 0,
                                  "params": {"microbatches": 2}}, None, None, metrics_frame(records))


def test_bubble_and_steps_from_trace_records():
    s0 = [["forward", 0, 0, 1, 0], ["forward", 1, 1, 2, 0], ["backward", 0, 5, 7, 0], ["backward", 1, 7, 9, 0]]
    s1 = [["recv_act", 0, -5, 1, -1], ["forward", 0, 1, 2, 0], ["forward", 1, 2, 3, 0], ["backward", 0, 3, 5, 0],
          ["backward", 1, 5, 7, 0]]
    run = _run("gpipe", 2, [s0, s1])
    assert list(traced_steps(run)) == [1]
    assert measured_bubble(run) == pytest.approx(1 / 3)  # (S-1)/(M+S-1) with S = M = 2
    assert math.isnan(measured_bubble(_run("gpipe", 2, [s0])))  # a step missing a stage is not measured
    assert math.isnan(measured_bubble(_run("gpipe", 1, [s0, s1], world_size=1)))  # virtual: no overlap to measure
    gantts = pipeline.gantt_figures([run])
    assert list(gantts) == ["gantt_gpipe.png"] and figures.png_bytes(gantts["gantt_gpipe.png"])[:4] == b"\x89PNG"


@pytest.mark.slow
def test_pipeline_suite_end_to_end(tmp_path, dtbench_here):
    path = tmp_path / "pipes.toml"
    path.write_text(SUITE)
    out = tmp_path / "out"
    proc = dtbench_here("run", str(path), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for run_id in ("gpipe-digits-mlp-w2-microbatches4-trace_steps3-s0", "pipedream-digits-mlp-w2-trace_steps3-s0"):
        run_dir = out / "pipes" / run_id
        records = read_jsonl(run_dir / "metrics.jsonl")
        train = [r for r in records if r["kind"] == "train"]
        assert {r["rank"] for r in train} == {0, 1}
        assert all(r["loss"] is None for r in train if r["rank"] == 0)  # the first stage computes no loss
        assert all(isinstance(r["loss"], float) for r in train if r["rank"] == 1)
        assert sorted({r["step"] for r in records if r["kind"] == "trace"}) == [1, 2, 3]
        assert {r["worker"] for r in records if r["kind"] == "trace"} == {0, 1}
        trace = json.loads((run_dir / "trace.json").read_text())
        assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
        evals = [r for r in records if r["kind"] == "eval"]
        assert [e["step"] for e in evals] == [0, 4, 7]  # the last one after PipeDream's drain
        partition = json.loads((run_dir / "partition.json").read_text())
        assert [s["blocks"] for s in partition["stages"]] in ([[0, 1], [1, 3]], [[0, 2], [2, 3]])
        assert all(s["predicted_compute_s"] > 0 and s["measured_compute_s"] > 0 for s in partition["stages"])
        assert len(partition["profiles"]) == 3
    assert "best_with_replication" in partition  # pipedream's 'auto' split
    proc = dtbench_here("report", str(out / "pipes"))
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "pipes" / "report" / "summary.csv")
    assert table["bubble"].between(0, 1).all()
    assert (table["peak_activation_bytes"] > 0).all()
    assert table.set_index("method")["peak_weight_bytes"].to_dict()["gpipe"] == 0  # no stash: live weights only
    page = (out / "pipes" / "report" / "index.html").read_text()
    assert "<h2>Pipelines</h2>" in page
    assert 'href="../gpipe-digits-mlp-w2-microbatches4-trace_steps3-s0/trace.json"' in page
    assert {p.name for p in (out / "pipes" / "report").glob("gantt_*.png")} == {
        "gantt_gpipe_x2.png", "gantt_pipedream_x2.png"}
