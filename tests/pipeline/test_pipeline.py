"""Pipeline methods: transparency, weight-stash versions, multi-process = virtual, evaluation, torch's schedules."""

from __future__ import annotations

import pytest
import torch

from _dist import context, spawn, train_steps
from harness.data.tensors import Batch, DataOrder
from harness.evaluation import evaluate_classifier


def _make(name, rank=0, world_size=1, params=None, records=None):
    cls, ctx = context(name, rank, world_size, params)
    if records is not None:
        ctx.log = lambda kind, **fields: records.append((kind, fields))
    return cls(ctx)


_train = train_steps


def _stage_params(method, stage):
    return [p.detach().clone() for p in method.stages[stage].module.parameters()]


def _flat(method):
    return torch.cat([p.flatten() for s in sorted(method.stages) for p in _stage_params(method, s)])


def _sgd_flat(steps):
    sgd = _make("sgd")
    _train(sgd, steps)
    return torch.cat([p.detach().flatten() for p in sgd.model.parameters()]), sgd


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", [(2, 4), (3, 5), (3, 1), (1, 3)])
def test_flushed_pipelines_are_transparent(name, stages, micro):
    """After each step the parameters equal single-process SGD's on the same minibatches (torchgpipe's
    test_transparency), whatever the split and the microbatch count (5 does not divide the batch of 32)."""
    reference, sgd = _sgd_flat(3)
    method = _make(name, params={"stages": stages, "microbatches": micro})
    losses = _train(method, 3)
    torch.testing.assert_close(_flat(method), reference, rtol=0, atol=1e-6)
    assert all(isinstance(v, float) for v in losses)


def test_pipedream_with_one_stage_is_sgd_and_with_two_is_not():
    reference, _ = _sgd_flat(6)
    one = _make("pipedream", params={"stages": 1})
    _train(one, 6)
    assert torch.equal(_flat(one), reference)  # no stage in flight: no staleness, no stash
    two = _make("pipedream", params={"stages": 2, "partition": "uniform"})
    _train(two, 6)
    assert (_flat(two) - reference).abs().max() > 1e-4  # stage 0's gradients are one update stale


@pytest.mark.parametrize("vertical_sync", [False, True])
def test_each_backward_uses_its_forwards_stashed_version(vertical_sync):
    stages, steps = 3, 9
    records = []
    method = _make("pipedream", params={"stages": stages, "partition": "uniform", "trace_steps": steps,
                                        "vertical_sync": vertical_sync}, records=records)
    _train(method, steps, drain=False)
    traces = [f for kind, f in records if kind == "trace"]
    assert {f["worker"] for f in traces} == set(range(stages))
    for s in range(stages):
        events = [e for f in traces if f["worker"] == s for e in f["events"]]
        assert {e.stage for e in events} == {s}
        fwd = {e.mb: e.version for e in events if e.op == "forward"}
        bwd = {e.mb: e.version for e in events if e.op == "backward"}
        lag = stages - 1 if vertical_sync else stages - 1 - s
        # trace_steps counts from step 1, so minibatch 0 is not traced
        assert fwd == {t: max(0, t - lag) for t in range(1, steps)}
        # the backward differentiates the weights its forward used
        assert bwd == {t: max(0, t - lag) for t in range(min(bwd), max(bwd) + 1)}
        assert max(bwd) == steps - 1 - (stages - 1 - s)
        assert method.stages[s].policy.held() <= (stages - s if not vertical_sync else stages)
    method.end_training()
    assert all(method.stages[s].in_flight() == 0 for s in range(stages))


def test_evaluation_through_the_pipeline_equals_the_whole_model():
    method = _make("gpipe", params={"stages": 3, "microbatches": 2})
    _train(method, 4)
    whole = torch.nn.Sequential(*[block for s in range(3) for block in method.stages[s].module])
    expected = evaluate_classifier(whole, method.ctx.workload.test, method.ctx.workload.loss, method.ctx.comm)
    got = method.evaluate(method.ctx.workload.test)
    assert got.accuracy == expected.accuracy and got.loss == pytest.approx(expected.loss, rel=1e-9)


def test_bad_configurations_are_refused():
    from methods.pipeline.flushed.gpipe import GPipe

    params = GPipe.Params(stages=3, microbatches=4)
    assert "one stage per rank" in GPipe.check_world_size(2, params)
    assert "need 3 ranks" in GPipe.check_world_size(2, GPipe.Params(replicas=[2, 1]))
    assert "replicas lists 2 stages" in GPipe.check_world_size(3, GPipe.Params(replicas=[2, 1], stages=3))
    assert "exceeds batch_size" in GPipe.check_world_size(1, GPipe.Params(microbatches=64, batch_size=32))
    assert "boundaries" in GPipe.check_world_size(1, GPipe.Params(stages=3, partition=[1]))
    with pytest.raises(ValueError, match="increasing"):
        GPipe.Params(partition=[2, 1])
    with pytest.raises(ValueError, match="too few"):
        _make("gpipe", params={"stages": 4})  # digits-mlp has 3 blocks


def _ranks(rank, world_size, name, params, steps):
    records = []
    method = _make(name, rank, world_size, params, records)
    losses = _train(method, steps)
    result = method.evaluate(method.ctx.workload.test)
    method.finish()
    sent = method.ctx.comm.ledger.by_category()
    return _stage_params(method, rank), losses, (result.accuracy, result.loss), sent, records


@pytest.mark.slow
@pytest.mark.parametrize("name,params,world_size", [
    ("gpipe", {"microbatches": 4}, 2), ("1f1b", {"microbatches": 3}, 3), ("pipedream", {"partition": "uniform"}, 2),
    ("pipedream", {"partition": "uniform"}, 3), ("pipedream", {"partition": "uniform", "vertical_sync": True}, 3)])
def test_multi_process_executor_equals_the_virtual_one(name, params, world_size):
    out = spawn(_ranks, world_size, name, params, 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: the same reduction order in every matmul
    try:
        virtual = _make(name, params={**params, "stages": world_size})
        losses = _train(virtual, 5)
        result = virtual.evaluate(virtual.ctx.workload.test)
    finally:
        torch.set_num_threads(threads)
    for s, (params_s, losses_s, eval_s, sent, _) in enumerate(out):
        for a, b in zip(params_s, _stage_params(virtual, s), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
        assert eval_s[0] == result.accuracy and eval_s[1] == pytest.approx(result.loss, rel=1e-6)
        if s == world_size - 1:
            assert losses_s == pytest.approx(losses, rel=1e-6)
        else:
            assert all(v is None for v in losses_s)
        if s < world_size - 1:  # activations go forward: 5 minibatches of 32 rows of the stage's output
            assert sent["activations"][0] > 0 and sent["activation_grads"][1] == sent["activations"][0]


def _ours_and_torch(rank, world_size, name, micro):
    """One step of our pipeline and of torch.distributed.pipelining's schedule from the same weights and batch."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    method = _make(name, rank, world_size, {"microbatches": micro, "partition": [1], "lr": 0.1, "momentum": 0.0})
    ctx = method.ctx
    data = ctx.workload.train
    batch = Batch(0, 0.0, DataOrder(len(data), 32, seed=0).batch(0), data, 0)
    torch.manual_seed(0)
    full = ctx.workload.make_model()
    torch_stage_module = full[:1] if rank == 0 else full[1:]
    before = [p.detach().clone() for p in torch_stage_module.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, _stage_params(method, rank), strict=True))
    ours_loss = method.train_step(batch).loss
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    stage = PipelineStage(torch_stage_module, rank, world_size, torch.device("cpu"))
    schedule = cls(stage, n_microbatches=micro, loss_fn=torch.nn.functional.cross_entropy)
    losses = []
    if rank == 0:
        schedule.step(batch.inputs())
    else:
        schedule.step(target=batch.targets(), losses=losses)
    with torch.no_grad():
        for p in torch_stage_module.parameters():
            p -= 0.1 * p.grad
    theirs = [p.detach().clone() for p in torch_stage_module.parameters()]
    torch_loss = float(torch.stack(losses).mean()) if losses else None
    return _stage_params(method, rank), theirs, ours_loss, torch_loss


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_same_step_as_torch_distributed_pipelining(name):
    """Our schedules against torch's executors on gloo: the same loss and the same parameters after one step."""
    for rank, (ours, theirs, ours_loss, torch_loss) in enumerate(spawn(_ours_and_torch, 2, name, 4)):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        if rank == 1:
            assert ours_loss == pytest.approx(torch_loss, rel=1e-6)


def test_flushed_pipeline_state_round_trips(tmp_path):
    """gpipe's state after 3 steps, saved and loaded (weights_only) into a fresh method, continues exactly."""
    params = {"stages": 3, "microbatches": 2, "momentum": 0.9}
    straight = _make("gpipe", params=params)
    data = straight.ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    batches = [Batch(t, 0.0, order.batch(t), data, 0) for t in range(5)]
    for b in batches:
        straight.train_step(b)
    first = _make("gpipe", params=params)
    for b in batches[:3]:
        first.train_step(b)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    resumed = _make("gpipe", params=params)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    for b in batches[3:]:
        resumed.train_step(b)
    assert torch.equal(_flat(resumed), _flat(straight))
