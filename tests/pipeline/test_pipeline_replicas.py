"""Replicated stages (PipeDream's hybrid plans): multi-process equals virtual, a flushed schedule still equals sgd,
and pipedream runs the partitioner's plan with replication."""

from __future__ import annotations

import json

import pytest
import torch

from _dist import context, spawn, train_steps


def _make(name, rank=0, world_size=1, params=None, run_dir=None):
    cls, ctx = context(name, rank, world_size, params, run_dir=run_dir)
    return cls(ctx)


_train = train_steps


def _params_of(method):
    """{(rank, stage): flat parameters} of every worker this method holds."""
    return {key: torch.cat([p.detach().flatten() for p in st.module.parameters()])
            for key, st in method.workers.items()}


def _ranks(rank, world_size, name, params, steps):
    method = _make(name, rank, world_size, params)
    losses = _train(method, steps)
    result = method.evaluate(method.ctx.workload.test)
    method.finish()
    return _params_of(method), losses, (result.accuracy, result.loss), method.ctx.comm.ledger.by_category()


@pytest.mark.slow
@pytest.mark.parametrize("name,params", [
    ("gpipe", {"replicas": [2, 1], "microbatches": 4}),
    ("1f1b", {"replicas": [1, 2], "microbatches": 4}),
    ("pipedream", {"replicas": [2, 1], "partition": "uniform"}),
])
def test_three_ranks_with_a_replicated_stage_equal_the_virtual_executor(name, params):
    out = spawn(_ranks, 3, name, params, 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: the same reduction order in every matmul
    try:
        virtual = _make(name, params=params)
        losses = _train(virtual, 5)
        result = virtual.evaluate(virtual.ctx.workload.test)
    finally:
        torch.set_num_threads(threads)
    expected = _params_of(virtual)
    for rank, (got, _, evaluation, sent) in enumerate(out):
        for key, flat in got.items():
            torch.testing.assert_close(flat, expected[key], rtol=0, atol=1e-6)
        assert evaluation[0] == result.accuracy and evaluation[1] == pytest.approx(result.loss, rel=1e-6)
        replicated_stage = params["replicas"].index(2)
        if rank in virtual.placement.ranks_of(replicated_stage):
            assert sent["gradient_sync"][0] > 0  # the replicas' all-reduce, accounted
    last = [r for r in range(3) if virtual.placement.stages_of(r) == [1]]
    total = [sum(v for v in vals if v is not None) for vals in zip(*(out[r][1] for r in last), strict=True)]
    assert total == pytest.approx([loss for loss in losses], rel=1e-5)
    # replicas of a stage hold the same weights after every update
    stage0 = [flat for (r, s), flat in expected.items() if s == replicated_stage]
    assert all(torch.equal(stage0[0], other) for other in stage0[1:])


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("replicas", [[2, 1], [1, 3], [2, 2]])
def test_a_flushed_schedule_with_replicas_equals_sgd(name, replicas):
    sgd = _make("sgd")
    _train(sgd, 3)
    reference = torch.cat([p.detach().flatten() for p in sgd.model.parameters()])
    method = _make(name, params={"replicas": replicas, "microbatches": 4})
    _train(method, 3)
    flat = torch.cat([p.detach().flatten() for s in sorted(method.stages)
                      for p in method.stages[s].module.parameters()])
    torch.testing.assert_close(flat, reference, rtol=0, atol=1e-6)


def _planned(rank, world_size, run_dir):
    method = _make("pipedream", rank, world_size, {"replicas": "auto", "partition": "auto"}, run_dir=run_dir)
    _train(method, 4)
    method.finish()
    return method.plan.ranges, method.plan.replicas


@pytest.mark.slow
def test_pipedream_runs_the_partitioners_plan_with_replication(tmp_path):
    plans = spawn(_planned, 3, tmp_path)
    assert all(plan == plans[0] for plan in plans)
    record = json.loads((tmp_path / "partition.json").read_text())
    best = record["best_with_replication"]
    ranges, replicas = plans[0]
    assert [[s["start"], s["end"]] for s in best["stages"]] == [list(r) for r in ranges]
    assert [s["replicas"] for s in best["stages"]] == replicas and sum(replicas) == 3
    assert [s["replicas"] for s in record["stages"]] == replicas
    assert all(s["measured_compute_s"] > 0 for s in record["stages"])


def test_replica_configurations_are_checked():
    from methods.pipeline.flushed.gpipe import GPipe
    from methods.pipeline.pipedream.pipedream import PipeDream

    assert "does not plan replication" in GPipe.check_world_size(3, GPipe.Params(replicas="auto", partition="auto"))
    assert "needs partition = 'auto'" in PipeDream.check_world_size(3, PipeDream.Params(replicas="auto",
                                                                                      partition="uniform"))
    assert "vertical_sync" in PipeDream.check_world_size(3, PipeDream.Params(replicas=[2, 1], vertical_sync=True))
    assert PipeDream.check_world_size(3, PipeDream.Params(replicas="auto")) is None
    with pytest.raises(ValueError, match="at least 1 replica"):
        GPipe.Params(replicas=[2, 0])
