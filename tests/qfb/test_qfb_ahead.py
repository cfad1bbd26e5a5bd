"""Q-FB's prototype reading (sync = "ahead"): the schedule's leads and staleness bound, the update equal to a
hand-written delayed-gradient loop, one lane = two lanes = two processes, and the two-segment quantizer."""

from __future__ import annotations

import math

import pytest
import torch
from test_qfb import OFF, _flat, _make, _ranks, _sgd_flat, _train
from torch.func import functional_call

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from harness.schedule.ir import Op, compute_order
from methods.pipeline.core.interleaver import validate
from methods.pipeline.core.placement import Placement
from methods.pipeline.core.views import split_sizes
from methods.pipeline.qfb.ahead import AheadVersions
from methods.pipeline.qfb.piecewise import Piecewise
from methods.pipeline.qfb.schedule import ahead_lead, ahead_version, qfb_ahead_drain, qfb_ahead_tick


def _whole_run(stage, stages, micro, windows, buffer):
    return [a for t in range(windows) for a in qfb_ahead_tick(stage, stages, micro, t, buffer)] + qfb_ahead_drain(
        stage, stages, micro, windows - 1, buffer)


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro", [1, 2, 3, 5])
@pytest.mark.parametrize("buffer", [1, 2, 3, 6])
def test_the_schedule_is_valid_and_each_forward_sees_exactly_its_version(stages, micro, buffer):
    """Every microbatch's forward and backward once, an update after every M backwards, the forward of n after
    exactly ahead_version(n) updates, and the staleness n // M - v(n) at most ceil((lead - 1) / M), reached."""
    windows = 4
    run = [_whole_run(s, stages, micro, windows, buffer) for s in range(stages)]
    validate(run, Placement.one_per_rank(stages))
    for s, actions in enumerate(run):
        lead = ahead_lead(s, stages, buffer)
        updates, backwards, staleness = 0, 0, []
        for a in actions:
            n = a.iteration * micro + (a.mb or 0)
            if a.op is Op.FORWARD:
                assert updates == ahead_version(n, lead, micro)
                staleness.append(n // micro - updates)
            elif a.op is Op.BACKWARD:
                assert n == backwards  # in order, each once
                backwards += 1
            elif a.op is Op.UPDATE:
                assert backwards % micro == 0
                updates += 1
        assert backwards == windows * micro and updates == windows
        assert max(staleness) == min(math.ceil((lead - 1) / micro), windows - 1)


def test_the_last_stage_runs_each_backward_right_after_its_forward():
    assert compute_order([qfb_ahead_tick(1, 2, 2, 1, 5)]) == [["1F0@1", "1B0@1", "1F1@1", "1B1@1", "1U"]]
    assert compute_order([qfb_ahead_tick(0, 2, 2, 1, 3)]) == [["0F0@1", "0B0", "0F1@1", "0B1", "0U"]]
    assert compute_order([qfb_ahead_drain(0, 2, 2, 1, 3)]) == [["0B0@1", "0B1@1", "0U"]]


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("stages,micro", [(1, 4), (2, 4), (3, 3)])
def test_buffer_one_is_sgd(lanes, stages, micro):
    reference = _sgd_flat(4)
    method = _make(params={**OFF, "stages": stages, "microbatches": micro, "lanes": lanes, "momentum": 0.9,
                           "sync": "ahead", "buffer": 1})
    _train(method, 4)
    torch.testing.assert_close(_flat(method), reference, rtol=0, atol=1e-6)
    method.finish()


def _delayed_reference(steps, micro, leads, boundaries, lr=0.05, momentum=0.9):
    """Momentum SGD on the sum of M microbatch gradients per step, where the gradient of microbatch n is taken with
    stage s's parameters at version ahead_version(n, leads[s], M): the prototype reading's update, written out."""
    cls, ctx = context("sgd", 0, 1, {"lr": lr})
    model = cls(ctx).model
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    names = [n for n, _ in model.named_parameters()]
    stage_of = {name: sum(i >= b for b in boundaries) for i, name in enumerate(names)}
    history = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    velocity = {n: torch.zeros_like(w) for n, w in history[0].items()}
    for t in range(steps):
        batch = Batch(t, 0.0, order.batch(t), data, 0)
        x, y = batch.inputs(), batch.targets()
        grads = {n: torch.zeros_like(w) for n, w in history[0].items()}
        start = 0
        for mb, size in enumerate(split_sizes(len(x), micro)):
            n = t * micro + mb
            weights = {name: history[ahead_version(n, leads[stage_of[name]], micro)][name].clone().requires_grad_()
                       for name in names}
            loss = ctx.workload.loss(functional_call(model, weights, (x[start:start + size],)),
                                     y[start:start + size]) * (size / len(x))
            for name, g in zip(names, torch.autograd.grad(loss, list(weights.values())), strict=True):
                grads[name] += g
            start += size
        velocity = {n: momentum * velocity[n] + grads[n] for n in names}
        history.append({n: history[-1][n] - lr * velocity[n] for n in names})
    return torch.cat([history[-1][n].flatten() for n in names])


@pytest.mark.parametrize("stages,micro,buffer", [(2, 2, 3), (2, 4, 6), (3, 2, 4)])
def test_the_update_is_the_hand_written_delayed_gradient_loop(stages, micro, buffer):
    steps = 5
    method = _make(params={**OFF, "stages": stages, "microbatches": micro, "momentum": 0.9, "sync": "ahead",
                           "buffer": buffer})
    _train(method, steps)
    counts = [len(list(method.stages[s].module.parameters())) for s in range(stages)]
    boundaries = [sum(counts[:s + 1]) for s in range(stages - 1)]
    leads = [ahead_lead(s, stages, buffer) for s in range(stages)]
    expected = _delayed_reference(steps, micro, leads, boundaries)
    torch.testing.assert_close(_flat(method), expected, rtol=0, atol=1e-6)
    assert (_flat(method) - _sgd_flat(steps)).abs().max() > 1e-4  # the delay is real: not sgd
    bound = math.ceil(buffer / micro) + 1
    assert all(st.policy.held() <= bound for st in method.workers.values())
    method.finish()


def test_a_copy_taken_while_a_forward_runs_on_a_stash_is_of_the_live_weights():
    """Q-FB's backward lane copies the weights after its update while its forward lane may be inside
    functional_call on a stash, which swaps the stash into the module for that call: the copy is still the live
    weights (the race that made two real lanes differ from one thread, once in a few runs)."""
    module = torch.nn.Linear(3, 2)
    policy = AheadVersions(module, lead=3, microbatches=2)
    stash = {name: torch.zeros_like(p) for name, p in module.named_parameters()}
    seen = []
    module.register_forward_pre_hook(lambda _module, _args: seen.append(policy.snapshot()))
    functional_call(module, stash, (torch.ones(1, 3),))
    assert len(seen) == 1
    for name, p in module.named_parameters():
        assert p.abs().sum() > 0
        torch.testing.assert_close(seen[0][name], p.detach(), rtol=0, atol=0)


@pytest.mark.slow
def test_two_lanes_on_two_processes_equal_the_virtual_mode_and_the_versions_are_exact():
    """Two real lanes per rank race each other; the weight versions make the result the single thread's."""
    params = {**OFF, "microbatches": 2, "lanes": 2, "sync": "ahead", "buffer": 3, "trace_steps": 4}
    results = spawn(_ranks, 2, params, 4)
    virtual = _make(params={**params, "stages": 2, "lanes": 1})
    _train(virtual, 4)
    torch.testing.assert_close(torch.cat([results[0][0], results[1][0]]), _flat(virtual), rtol=0, atol=1e-6)
    for rank, (_, _, traces, _) in enumerate(results):
        forwards = [e for trace in traces for e in trace["events"] if e.op == "forward"]
        assert forwards and {e.lane for e in forwards} == {0}
        for e in forwards:
            assert e.version == ahead_version(e.iteration * 2 + e.mb, ahead_lead(rank, 2, 3), 2)


def test_bad_configurations_are_refused():
    from methods.pipeline.qfb.qfb import QFB

    with pytest.raises(ValueError, match="buffer applies to sync = 'ahead' only"):
        QFB.Params(buffer=3)
    with pytest.raises(ValueError):
        QFB.Params(sync="ahead", buffer=0)
    assert QFB.Params(sync="ahead").lead == 5
    assert QFB.Params(gradient_codec="piecewise").gradient_codec == "piecewise"


# -- the two-segment quantizer ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (7,), (4, 33), (2, 8, 5, 5)])
def test_piecewise_round_trips_within_half_a_step_of_each_segment(shape):
    codec = Piecewise()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) ** 3  # heavy tails: both segments used
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.numel() == codec.nbytes(x.numel())
    y = codec.decode(payload, shape)
    top = float(x.abs().max())
    small = x.abs() < 0.1 * top
    assert (x - y).abs().max() <= codec.error_bound(x)
    if small.any():  # the small values get the fine segment: 64 steps over a tenth of the range
        assert (x - y)[small].abs().max() <= 0.1 * top / 128 + 1e-6 * top
    assert torch.equal(torch.sign(y[y != 0]), torch.sign(x[y != 0]))


def test_piecewise_segments_meet_and_zeros_survive():
    codec = Piecewise()
    x = torch.tensor([1.0, -0.1, 0.1 - 1e-7, 0.0, -1.0, 0.55])
    y = codec.decode(codec.encode(x), (6,))
    torch.testing.assert_close(y[:5], torch.tensor([1.0, -0.1, 0.1, 0.0, -1.0]), rtol=0, atol=1e-6)
    assert abs(float(y[5]) - 0.55) <= 0.9 / 382 + 1e-6
    assert torch.equal(codec.decode(codec.encode(torch.zeros(9)), (9,)), torch.zeros(9))
    with pytest.raises(ValueError):
        Piecewise(share=1.0)
