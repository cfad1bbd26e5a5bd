"""trace.json: pipeline traces in the Chrome trace-event format, checked against the schedule that ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.schedule.ir import SHORT
from harness.trace import TraceEvent
from harness.trace_export import chrome_trace
from methods.pipeline.flushed.schedules import interleaved_1f1b

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def test_slices_tracks_and_flows_of_a_tiny_trace():
    steps = {1: {0: [TraceEvent("forward", 0, 1.0, 2.0, 0, 0), TraceEvent("send_act", 0, 2.0, 2.1, -1, 0)],
                 1: [TraceEvent("recv_act", 0, 1.5, 2.5, -1, 1), TraceEvent("forward", 0, 2.5, 3.0, 0, 1, 0, 1)]}}
    trace = chrome_trace(steps)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["pid"], e["tid"]) for e in slices] == [("0F0", 0, 0), ("0sA0", 0, 0), ("1rA0", 1, 100),
                                                                ("1F0", 1, 101)]
    assert slices[0]["ts"] == 0 and slices[0]["dur"] == pytest.approx(1e6)
    start, finish = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    assert start["id"] == finish["id"] and (start["pid"], finish["pid"]) == (0, 1) and finish["bp"] == "e"
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {(0, None): "rank 0", (1, None): "rank 1", (0, 0): "stage 0", (1, 100): "stage 1",
                     (1, 101): "stage 1 lane 1"}


SUITE = """name = "traced"
workload = "digits-cnn"
seeds = [0]
threads_per_rank = 1
[budget]
max_steps = 3
[defaults]
batch_size = 32
[[run]]
method = "interleaved-1f1b"
world_size = 2
params = { microbatches = 4, trace_steps = 2 }
"""


@pytest.mark.slow
def test_trace_json_of_a_run_has_every_action_in_schedule_order(tmp_path):
    suite = tmp_path / "traced.toml"
    suite.write_text(SUITE)
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(tmp_path / "out"),
                           "--quiet"], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p for p in (tmp_path / "out" / "traced").iterdir() if p.is_dir()]
    trace = json.loads((run_dir / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    schedule = interleaved_1f1b(2, 2, 4)
    for step in (1, 2):
        for rank, actions in enumerate(schedule):
            for stage in sorted({a.stage for a in actions}):
                expected = [str(a) for a in actions if a.stage == stage]
                got = [e["name"] for e in sorted(slices, key=lambda e: e["ts"])
                       if e["args"]["step"] == step and e["pid"] == rank and e["tid"] == 100 * stage]
                assert got == expected, (step, rank, stage)
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    messages = sum(a.op.value.startswith("send") for actions in schedule for a in actions)
    assert len(flows) == 2 * 2 * messages  # every message of both steps: one start and one finish
    assert set(SHORT.values()) >= {"F", "B", "U"}
