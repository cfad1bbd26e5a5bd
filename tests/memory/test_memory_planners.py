"""Planners under memory_per_rank: PipeDream's DP and APapo's antichain DP keep to plans whose every stage fits,
choose data parallelism where it fits and is fastest and a pipeline where it does not, say why in partition.json,
and stop in one line when nothing fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.results import read_jsonl
from methods.pipeline.apapo.antichain import Hardware, antichain_partition
from methods.pipeline.apapo.graph import LayerGraph, members
from methods.pipeline.core.block_profile import BlockProfile
from methods.pipeline.core.partitioner import NoPlanFits, pipedream_partition, straight_partition

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}

#: Four equal blocks whose weights are cheap to synchronise: without a budget, data parallelism is fastest.
BLOCKS = [BlockProfile(forward_s=1.0, backward_s=2.0, activation_bytes=10_000, param_bytes=1_000) for _ in range(4)]
BANDWIDTH = 1e9


def stage_bytes(start: int, end: int, replicas: int, after: int) -> int:
    """A toy price: weights, gradient, one optimizer slot and two versions per stage after it, and 100 bytes of
    activations per block per microbatch held (one more per stage after it)."""
    params = 1_000 * (end - start)
    return params * (3 + 2 * after) + 100 * (end - start) * (after + 1)


def test_pipedream_chooses_data_parallelism_where_it_fits_and_a_pipeline_where_it_does_not():
    free = pipedream_partition(BLOCKS, 2, BANDWIDTH)
    assert free.ranges == [(0, 4)] and free.replicas == [2]
    assert stage_bytes(0, 4, 2, 0) == 12_400
    fitted = pipedream_partition(BLOCKS, 2, BANDWIDTH, memory=stage_bytes, budget=12_000)
    assert fitted.replicas == [1, 1]
    assert all(stage_bytes(a, b, 1, 1 - i) <= 12_000 for i, (a, b) in enumerate(fitted.ranges))
    assert pipedream_partition(BLOCKS, 2, BANDWIDTH, memory=stage_bytes, budget=20_000).ranges == [(0, 4)]
    with pytest.raises(NoPlanFits):
        pipedream_partition(BLOCKS, 2, BANDWIDTH, memory=stage_bytes, budget=5_000)


def test_a_budget_moves_the_cut_off_the_fastest_split_to_one_that_fits():
    fastest = straight_partition(BLOCKS, 2, BANDWIDTH)
    assert fastest.ranges == [(0, 2), (2, 4)]
    # stage 0 holds two microbatches and two versions: [0,2) needs 10,400; [0,1) 5,200 and then [1,4) 9,300
    assert (stage_bytes(0, 2, 1, 1), stage_bytes(0, 1, 1, 1), stage_bytes(1, 4, 1, 0)) == (10_400, 5_200, 9_300)
    moved = straight_partition(BLOCKS, 2, BANDWIDTH, memory=stage_bytes, budget=10_000)
    assert moved.ranges == [(0, 1), (1, 4)]
    with pytest.raises(NoPlanFits):
        straight_partition(BLOCKS, 2, BANDWIDTH, memory=stage_bytes, budget=9_000)


def test_the_antichain_dp_keeps_to_stages_that_fit():
    graph = LayerGraph.chain(BLOCKS)
    hardware = Hardware.uniform(2, BANDWIDTH)

    def graph_bytes(previous: int, mask: int, replicas: int, after: int) -> int:
        nodes = members(mask & ~previous)
        return stage_bytes(nodes[0], nodes[-1] + 1, replicas, after)

    free = antichain_partition(graph, hardware)
    assert len(free.stages) == 1 and free.replicas == [2]
    fitted = antichain_partition(graph, hardware, memory=graph_bytes, budget=12_000)
    assert fitted.replicas == [1, 1]
    with pytest.raises(NoPlanFits):
        antichain_partition(graph, hardware, memory=graph_bytes, budget=5_000)


SUITE = """name = "planners"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 1
[budget]
max_steps = 6
[defaults]
batch_size = 32
lr = 0.05
momentum = 0.9
[[run]]
method = "pipedream"
world_size = 2
params = {{ replicas = "auto" }}
label = "pipedream"
{memory}
[[run]]
method = "apapo"
world_size = 2
params = {{ microbatches = 4, profile = "counted", rank_speeds = [1.0, 1.0], bandwidth = 1e9 }}
label = "apapo"
{memory}
"""


def _run(tmp_path, memory: str):
    path = tmp_path / "planners.toml"
    path.write_text(SUITE.format(memory=memory))
    result = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(tmp_path)],
                            env=ENV, capture_output=True, text=True, timeout=300)
    runs = {}
    for spec in (tmp_path / "planners").glob("*/spec.json"):
        folder = spec.parent
        partition = folder / "partition.json"
        planned = [r for r in read_jsonl(folder / "metrics.jsonl") if r.get("kind") == "memory"]
        runs[json.loads(spec.read_text())["label"]] = (
            json.loads((folder / "status.json").read_text()),
            json.loads(partition.read_text()) if partition.exists() else None,
            planned[0]["per_rank"] if planned else None)
    return result, runs


@pytest.mark.slow
def test_planners_choose_data_parallelism_without_a_budget(tmp_path):
    result, runs = _run(tmp_path, "")
    assert result.returncode == 0, result.stdout + result.stderr
    pipedream, apapo = runs["pipedream"][1], runs["apapo"][1]
    assert [s["replicas"] for s in pipedream["stages"]] == [2]
    assert apapo["choice"]["chosen"] == "data parallel"
    for partition in (pipedream, apapo):
        memory = partition["memory"]
        assert memory["memory_per_rank"] is None and len(memory["stage_bytes"]) == 1
        assert [c["verdict"] for c in memory["candidates"]].count("chosen") == 1


@pytest.mark.slow
def test_planners_choose_a_pipeline_when_a_replica_does_not_fit(tmp_path):
    # 340 KB (2026-12-08): below data parallelism's plan (pipedream 354,168, apapo 400,956 per rank), above each
    # pipeline's (pipedream 248,320/295,800, apapo 257,024/329,788)
    result, runs = _run(tmp_path, 'memory_per_rank = "340KB"')
    assert result.returncode == 0, result.stdout + result.stderr
    for label in ("pipedream", "apapo"):
        status, partition, planned = runs[label]
        assert status["state"] == "completed"
        memory = partition["memory"]
        assert memory["memory_per_rank"] == 340_000
        assert len(memory["stage_bytes"]) == 2 and max(memory["stage_bytes"]) <= 340_000
        assert memory["held_microbatches"][-1] == 1 and memory["held_microbatches"][0] >= 2
        verdicts = {c["shape"].split(" (")[0]: c["verdict"] for c in memory["candidates"]}
        replicated = next(v for shape, v in verdicts.items() if shape.startswith("data parallel"))
        assert replicated.startswith("does not fit: stage 0 needs") and "> memory_per_rank 340.0 KB" in replicated
        # the planner's price of each stage is the run's own plan of the rank that holds it, to the byte: the
        # planners walk the runner's terms with the runner's walk
        assert memory["stage_bytes"] == [planned[str(rank)]["total"] for rank in range(2)]
        assert status["final"]["planned_memory_bytes"] <= 340_000


@pytest.mark.slow
def test_when_no_plan_fits_the_run_stops_in_one_line_with_what_the_smallest_needs(tmp_path):
    result, runs = _run(tmp_path, 'memory_per_rank = "100KB"')
    assert result.returncode == 0, result.stdout + result.stderr
    for label in ("pipedream", "apapo"):
        status, partition, _ = runs[label]
        assert status["state"] == "does_not_fit" and partition is None
        line = status["error"]["message"]
        assert line.startswith("does not fit: no plan fits memory_per_rank 100.0 KB; the smallest, ")
        assert "needs" in line and "\n" not in line
