"""APapo end to end through the CLI: heterogeneous threads per rank, partition.json with the antichain plan, the
predicted and measured stage times and the overlap accounting; and the suite checks of per-rank threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.suite.expand import expand_suite
from harness.suite.files import FileError
from methods.pipeline.core.overlap import overlap_summary

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}

SUITE = """name = "apapo-e2e"
workload = "digits-resnet"
workload_options = { depth = 8 }
seeds = [0]
[budget]
max_steps = 6
eval_every_epochs = 1
[defaults]
batch_size = 32
lr = 0.05
[[run]]
method = "apapo"
world_size = 2
threads_per_rank = [1, 1]
cpus_per_rank = [[0], [1]]
params = { microbatches = 4, trace_steps = 4, replicate = false }
"""


@pytest.mark.slow
def test_an_apapo_run_writes_its_plan_and_the_overlap_it_measured(tmp_path):
    suite = tmp_path / "apapo.toml"
    suite.write_text(SUITE)
    root = Path(__file__).resolve().parents[2]
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(root), ENV.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p for p in (tmp_path / "out" / "apapo-e2e").iterdir() if p.name.startswith("apapo-")]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    record = json.loads((run_dir / "partition.json").read_text())
    assert record["mode"] == "antichain" and len(record["graph_plan"]["stages"]) == 2
    assert len(record["rank_speeds"]) == 2 and record["bandwidth"][0][1] > 0
    assert all(s["predicted_s"] > 0 and s["measured_compute_s"] > 0 for s in record["stages"])
    overlap = record["overlap"]
    assert [s["stage"] for s in overlap["stages"]] == [0, 1]
    assert overlap["comm_s"] > 0 and 0 <= overlap["hidden_share"] <= 1
    assert all(s["messages"] > 0 and s["compute_s"] > 0 for s in overlap["stages"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["threads"]["per_rank"] == [1, 1]
    assert json.loads((run_dir / "spec.json").read_text())["cpus_per_rank"] == [[0], [1]]


def test_per_rank_threads_must_name_every_rank(tmp_path):
    suite = tmp_path / "bad.toml"
    suite.write_text(SUITE.replace("threads_per_rank = [1, 1]", "threads_per_rank = [2, 1, 1]"))
    with pytest.raises(FileError, match=r"run\[0\].threads_per_rank: .* one per rank \(2\)"):
        expand_suite(suite)
    suite.write_text(SUITE.replace("cpus_per_rank = [[0], [1]]", "cpus_per_rank = [[0]]"))
    with pytest.raises(FileError, match=r"run\[0\].cpus_per_rank: give one non-empty list of CPU ids per rank"):
        expand_suite(suite)
    suite.write_text(SUITE)
    (spec,) = expand_suite(suite)
    assert spec.threads_per_rank == [1, 1] and spec.cpus_per_rank == [[0], [1]]


def test_overlap_accounting_joins_sends_and_arrivals():
    def trace(worker, events):
        return {"kind": "trace", "step": 1, "worker": worker, "events": events}

    records = [
        # stage 0 computes 0..1, sends act 0 at 1; stage 1 computes 0..2 (busy), waits for act 0 from 2 to 3
        trace(0, [["forward", 0, 0.0, 1.0, 0, 0, 0], ["send_act", 0, 1.0, 1.0, -1, 0, 0]]),
        trace(1, [["forward", 9, 0.0, 2.0, 0, 1, 0], ["recv_act", 0, 2.0, 3.0, -1, 1, 0],
                  ["forward", 0, 3.0, 4.0, 0, 1, 0]]),
        {"kind": "arrivals", "step": 1, "worker": 1, "messages": [["act", 0, 0, 0, 3.0]]},
    ]
    summary = overlap_summary(records)
    stage1 = summary["stages"][1]
    assert stage1["comm_s"] == pytest.approx(2.0)  # in flight from 1 (sent) to 3 (arrived)
    assert stage1["exposed_s"] == pytest.approx(1.0) and stage1["hidden_s"] == pytest.approx(1.0)
    assert summary["hidden_share"] == pytest.approx(0.5)
    assert summary["stages"][0]["compute_s"] == pytest.approx(1.0)


def test_a_transfer_its_sender_sat_blocked_in_is_not_hidden():
    """Overlap off: gloo's send blocks until the receive is posted, so the receiver computing meanwhile hides
    nothing: the sender waited."""
    def trace(worker, events):
        return {"kind": "trace", "step": 1, "worker": worker, "events": events}

    records = [
        # stage 0 sends act 0 from 1 and blocks until 2.5; stage 1 computes 0..2, waits from 2 to 3
        trace(0, [["forward", 0, 0.0, 1.0, 0, 0, 0], ["send_act", 0, 1.0, 2.5, -1, 0, 0]]),
        trace(1, [["forward", 9, 0.0, 2.0, 0, 1, 0], ["recv_act", 0, 2.0, 3.0, -1, 1, 0]]),
        {"kind": "arrivals", "step": 1, "worker": 1, "messages": [["act", 0, 0, 0, 3.0]]},
    ]
    stage1 = overlap_summary(records)["stages"][1]
    assert stage1["comm_s"] == pytest.approx(2.0)
    assert stage1["hidden_s"] == pytest.approx(0.0)  # 1..2.5 the sender waited, 2..3 the receiver
    records[0]["events"][1] = ["send_act", 0, 1.0, 1.5, -1, 0, 0]  # the send returns at 1.5: 1.5..2 is hidden
    assert overlap_summary(records)["stages"][1]["hidden_s"] == pytest.approx(0.5)
