"""Q-FB: exact sync equals sgd (1 and 2 stages, 1 and 2 lanes, virtual and 2 processes), bounded sync is
PipeDream-2BW's one-step delay, the lanes overlap, the schedule is valid."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from _dist import context, spawn, train_steps
from harness.data.tensors import Batch, DataOrder
from harness.schedule.ir import compute_order
from methods.pipeline.core.interleaver import validate
from methods.pipeline.core.placement import Placement
from methods.pipeline.qfb.schedule import qfb_drain, qfb_tick

OFF = {"activation_codec": "none", "gradient_codec": "none"}


def _make(rank=0, world_size=1, params=None, records=None, workload="digits-mlp", options=None):
    cls, ctx = context("qfb", rank, world_size, params, workload=workload, options=options)
    if records is not None:
        ctx.log = lambda kind, **fields: records.append((kind, fields))
    return cls(ctx)


_train = train_steps


def _flat(method):
    stages = method.stages
    return torch.cat([p.detach().flatten() for s in sorted(stages) for p in stages[s].module.parameters()])


def _sgd_flat(steps):
    cls, ctx = context("sgd", 0, 1, {"momentum": 0.9})
    sgd = cls(ctx)
    _train(sgd, steps)
    return torch.cat([p.detach().flatten() for p in sgd.model.parameters()])


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("stages,micro", [(1, 4), (2, 4), (3, 3)])
def test_exact_qfb_with_codecs_off_equals_sgd(lanes, stages, micro):
    """Accumulated updates without loss of precision: after 4 steps the parameters equal sgd's (momentum 0.9)."""
    reference = _sgd_flat(4)
    method = _make(params={**OFF, "stages": stages, "microbatches": micro, "lanes": lanes, "momentum": 0.9})
    _train(method, 4)
    torch.testing.assert_close(_flat(method), reference, rtol=0, atol=1e-6)
    method.finish()


def _ranks(rank, world_size, params, steps):
    records = []
    method = _make(rank, world_size, params, records)
    losses = _train(method, steps)
    method.finish()
    flat = torch.cat([p.detach().flatten() for p in method.stages[rank].module.parameters()])
    traces = [f for kind, f in records if kind == "trace"]
    return flat, losses, traces, method.ctx.comm.ledger.by_category()


@pytest.mark.slow
@pytest.mark.parametrize("lanes", [1, 2])
def test_exact_qfb_on_two_processes_equals_sgd(lanes):
    reference = _sgd_flat(4)
    params = {**OFF, "microbatches": 4, "lanes": lanes, "momentum": 0.9, "trace_steps": 3}
    results = spawn(_ranks, 2, params, 4)
    torch.testing.assert_close(torch.cat([results[0][0], results[1][0]]), reference, rtol=0, atol=1e-6)
    assert all(loss is None for loss in results[0][1]) and all(isinstance(v, float) for v in results[1][1])


def _overlaps(events, stage):
    forwards = [e for e in events if e.op == "forward" and e.stage == stage]
    backwards = [e for e in events if e.op == "backward" and e.stage == stage]
    return [(f, b) for f in forwards for b in backwards if f.mb != b.mb and f.start < b.end and b.start < f.end]


#: Compute-bound stages (a forward or backward of a microbatch takes milliseconds, much longer than a thread's
#: wake-up) of nearly equal cost (blocks 0-2: 256x512 + 2 x 512x512; blocks 3-5: 2 x 512x512 + 512x10), so that
#: whether the lanes overlap depends on the schedule, not on the machine's timing. (A stage much faster than its
#: upstream neighbour spends its forward lane waiting for activations: its backwards overlap the waits instead.)
HEAVY = {"in_features": 256, "hidden": 512, "depth": 5, "num_train": 2048, "num_test": 256}


def _heavy_ranks(rank, world_size, params, steps):
    records = []
    method = _make(rank, world_size, {"batch_size": 512, "microbatches": 8, "trace_steps": steps, "partition": [3],
                                      **params}, records, workload="synthetic-mlp", options=HEAVY)
    _train(method, steps, batch_size=512)
    method.finish()
    return [f for kind, f in records if kind == "trace"]


@pytest.mark.slow
def test_the_lanes_overlap_on_two_processes_and_are_labelled():
    """The traces show a forward and a backward of different microbatches of one stage running at the same time,
    each on its lane, at both stages; with lanes = 1 nothing overlaps."""
    for rank, traces in enumerate(spawn(_heavy_ranks, 2, {"lanes": 2}, 6)):
        events = [e for t in traces for e in t["events"]]
        assert {e.lane for e in events if e.op in ("forward", "recv_act", "send_act")} == {0}
        assert {e.lane for e in events if e.op in ("backward", "recv_grad", "send_grad", "update")} == {1}
        assert _overlaps(events, rank), f"rank {rank}: no forward overlapped a backward"
    for rank, traces in enumerate(spawn(_heavy_ranks, 2, {"lanes": 1}, 2)):
        events = [e for t in traces for e in t["events"]]
        assert not _overlaps(events, rank) and {e.lane for e in events} == {0}


def test_one_stage_lanes_run_as_threads_in_one_process():
    records = []
    method = _make(params={"stages": 1, "microbatches": 8, "lanes": 2, "batch_size": 512, "trace_steps": 3},
                   records=records, workload="synthetic-mlp", options=HEAVY)
    _train(method, 4, batch_size=512)
    method.finish()
    events = [e for kind, f in records if kind == "trace" for e in f["events"]]
    assert _overlaps(events, 0) and {e.lane for e in events} == {0, 1}


def _two_bw_reference(steps, lr=0.05, workload="digits-mlp"):
    """W(t+1) = W(t) - lr · g_t(W(t-1)), W(-1) = W(0), then the drain applies g_T(W(T-1)): PipeDream-2BW."""
    cls, ctx = context("sgd", 0, 1, {"lr": lr}, workload=workload)
    model = cls(ctx).model
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    live = {n: p.detach().clone() for n, p in model.named_parameters()}
    previous = dict(live)
    for t in range(steps):
        batch = Batch(t, 0.0, order.batch(t), data, 0)
        stale = {n: w.clone().requires_grad_(True) for n, w in previous.items()}
        loss = ctx.workload.loss(functional_call(model, stale, (batch.inputs(),)), batch.targets())
        grads = torch.autograd.grad(loss, list(stale.values()))
        previous = {n: w.clone() for n, w in live.items()}
        live = {n: w - lr * g for (n, w), g in zip(live.items(), grads, strict=True)}
    return torch.cat([w.flatten() for w in live.values()])


@pytest.mark.parametrize("lanes,stages,workload", [(1, 1, "digits-mlp"), (2, 1, "digits-mlp"),
                                                   (1, 2, "digits-mlp"), (2, 2, "digits-mlp"), (2, 2, "digits-cnn")])
def test_bounded_sync_is_one_version_stale(lanes, stages, workload):
    steps = 5
    method = _make(params={**OFF, "stages": stages, "microbatches": 4, "lanes": lanes, "sync": "bounded",
                           "momentum": 0.0}, workload=workload)
    _train(method, steps)
    torch.testing.assert_close(_flat(method), _two_bw_reference(steps, workload=workload), rtol=0, atol=1e-6)
    assert all(st.policy.held() <= 2 for st in method.workers.values())
    method.finish()


@pytest.mark.slow
def test_bounded_sync_on_two_processes_equals_the_virtual_mode():
    params = {**OFF, "microbatches": 4, "lanes": 2, "sync": "bounded"}
    results = spawn(_ranks, 2, params, 4)
    virtual = _make(params=params)
    _train(virtual, 4)
    torch.testing.assert_close(torch.cat([results[0][0], results[1][0]]), _flat(virtual), rtol=0, atol=1e-6)


def test_schedules_are_valid_and_the_drain_completes_bounded():
    stages, micro = 3, 4
    for sync in ("exact", "bounded"):
        run = [[a for t in range(3) for a in qfb_tick(s, stages, micro, t, sync)]
               + (qfb_drain(s, stages, micro, 2) if sync == "bounded" else []) for s in range(stages)]
        validate(run, Placement.one_per_rank(stages))
    assert compute_order([qfb_tick(2, 3, 3, 0, "exact")]) == [["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2U"]]
    assert compute_order([qfb_tick(0, 3, 3, 1, "exact")]) == [["0F0@1", "0F1@1", "0F2@1", "0B0@1", "0B1@1",
                                                               "0B2@1", "0U@1"]]
    assert [str(a) for a in qfb_tick(1, 2, 2, 1, "bounded") if a.op.value in ("forward", "backward", "update")] == [
        "1F0@1", "1B0", "1F1@1", "1B1", "1U"]


def test_bad_configurations_are_refused():
    from methods.pipeline.qfb.qfb import QFB

    assert "does not replicate" in QFB.check_world_size(3, QFB.Params(replicas=[2, 1]))
    assert "exceeds batch_size" in QFB.check_world_size(1, QFB.Params(microbatches=64, batch_size=32))
    assert QFB.check_world_size(2, QFB.Params()) is None
    with pytest.raises(ValueError):
        QFB.Params(density=0)
    with pytest.raises(ValueError):
        QFB.Params(lanes=3)


def _steps(method, first, last, batch_size=32):
    data = method.ctx.workload.train
    order = DataOrder(len(data), batch_size, seed=0)
    for t in range(first, last):
        method.train_step(Batch(t, 0.0, order.batch(t), data, 0))


def test_exact_qfb_resumes_from_a_checkpoint_bitwise_with_its_codecs_residuals(tmp_path):
    params = {"stages": 2, "microbatches": 4, "lanes": 2, "density": 0.05}
    whole = _make(params=params)
    _steps(whole, 0, 5)
    first = _make(params=params)
    _steps(first, 0, 3)
    assert first.checkpointable and first.wire.gradient.residuals  # the 2-Step GC residuals are part of the state
    torch.save(first.state_dict(), tmp_path / "checkpoint.pt")
    resumed = _make(params=params)
    resumed.load_state_dict(torch.load(tmp_path / "checkpoint.pt", weights_only=True))
    _steps(resumed, 3, 5)
    assert torch.equal(_flat(resumed), _flat(whole))
    assert not _make(params={**params, "sync": "bounded"}).checkpointable  # a window in flight between steps
