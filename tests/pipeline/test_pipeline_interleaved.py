"""interleaved-1f1b: transparency, the virtual executor against two processes, and one step against torch's
ScheduleInterleaved1F1B on gloo."""

from __future__ import annotations

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder

SMALL = {"in_features": 16, "hidden": 32, "depth": 3, "num_train": 256, "num_test": 64}  # 4 blocks


def _make(rank=0, world_size=1, params=None):
    cls, ctx = context("interleaved-1f1b", rank, world_size, params, workload="synthetic-mlp", options=SMALL)
    return cls(ctx)


def _batches(method, steps, batch_size=32):
    data = method.ctx.workload.train
    order = DataOrder(len(data), batch_size, seed=0)
    return [Batch(t, 0.0, order.batch(t), data, 0) for t in range(steps)]


def test_interleaved_is_transparent():
    cls, ctx = context("sgd", 0, 1, {}, workload="synthetic-mlp", options=SMALL)
    sgd = cls(ctx)
    method = _make(params={"stages": 4, "stages_per_rank": 2, "microbatches": 4})
    for batch in _batches(method, 3):
        sgd.train_step(batch)
        method.train_step(batch)
    ours = torch.cat([p.detach().flatten() for s in range(4) for p in method.stages[s].module.parameters()])
    torch.testing.assert_close(ours, torch.cat([p.detach().flatten() for p in sgd.model.parameters()]),
                               rtol=0, atol=1e-6)
    assert method.placement.stages_of(0) == [0, 2] and method.placement.stages_of(1) == [1, 3]


def _ours_and_torch(rank, world_size, micro):
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    method = _make(rank, world_size, {"microbatches": micro, "lr": 0.1, "momentum": 0.0})
    batch = _batches(method, 1)[0]
    torch.manual_seed(0)
    full = method.ctx.workload.make_model()
    local = [full[s:s + 1] for s in (rank, rank + world_size)]
    for s, module in zip((rank, rank + world_size), local, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(module.parameters(), method.stages[s].module.parameters(),
                                                      strict=True))
    ours_loss = method.train_step(batch).loss
    stages = [PipelineStage(module, s, 2 * world_size, torch.device("cpu"))
              for s, module in zip((rank, rank + world_size), local, strict=True)]
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=micro, loss_fn=torch.nn.functional.cross_entropy)
    losses = []
    if rank == 0:
        schedule.step(batch.inputs())
    else:
        schedule.step(target=batch.targets(), losses=losses)
    with torch.no_grad():
        for module in local:
            for p in module.parameters():
                p -= 0.1 * p.grad
    ours = [p.detach().clone() for s in (rank, rank + world_size) for p in method.stages[s].module.parameters()]
    theirs = [p.detach().clone() for module in local for p in module.parameters()]
    method.finish()
    return ours, theirs, ours_loss, float(torch.stack(losses).mean()) if losses else None


@pytest.mark.slow
@pytest.mark.parametrize("micro", [4, 8])
def test_same_step_as_torch_interleaved_1f1b(micro):
    """2 gloo ranks, 4 stages: the same parameters after one step and the same loss as torch's executor."""
    for rank, (ours, theirs, ours_loss, torch_loss) in enumerate(spawn(_ours_and_torch, 2, micro)):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        if rank == 1:
            assert ours_loss == pytest.approx(torch_loss, rel=1e-6)


def _ranks(rank, world_size, steps):
    method = _make(rank, world_size, {"microbatches": 4})
    for batch in _batches(method, steps):
        method.train_step(batch)
    accuracy = method.evaluate(method.ctx.workload.test).accuracy
    method.finish()
    return {s: [p.detach().clone() for p in st.module.parameters()] for s, st in method.stages.items()}, accuracy


@pytest.mark.slow
def test_two_processes_equal_the_virtual_interleaved_pipeline():
    out = spawn(_ranks, 2, 3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        virtual = _make(params={"stages": 4, "microbatches": 4})
        for batch in _batches(virtual, 3):
            virtual.train_step(batch)
        accuracy = virtual.evaluate(virtual.ctx.workload.test).accuracy
    finally:
        torch.set_num_threads(threads)
    for stages, rank_accuracy in out:
        assert rank_accuracy == accuracy
        for s, params in stages.items():
            for a, b in zip(params, virtual.stages[s].module.parameters(), strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_interleaved_configurations_are_checked():
    from methods.pipeline.flushed.interleaved import Interleaved1F1B

    params = Interleaved1F1B.Params
    assert Interleaved1F1B.check_world_size(2, params(microbatches=4)) is None
    assert "stages_per_rank" in Interleaved1F1B.check_world_size(2, params(stages=6))
    assert "equal rounds" in Interleaved1F1B.check_world_size(4, params(microbatches=9, batch_size=36))
    assert "does not replicate" in Interleaved1F1B.check_world_size(2, params(replicas=[1, 1]))
    assert Interleaved1F1B.requested_stages(1, params(stages_per_rank=3)) == 6  # virtual: 2 simulated ranks
