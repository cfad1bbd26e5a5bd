"""What stages hold: peak activations as the schedules' theory says, stashed versions, and the `current` backward
mode (recompute with the weights current at backward time)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _dist import context
from harness.data.tensors import Batch, DataOrder
from methods.pipeline.core.stage import Stage
from methods.pipeline.core.versions import Live


def _step(name, params, steps=2):
    cls, ctx = context(name, 0, 1, params)
    method = cls(ctx)
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    return [method.train_step(Batch(t, 0.0, order.batch(t), data, 0)).extra for t in range(steps)], method


@pytest.mark.parametrize("stages,micro", [(2, 4), (3, 2), (3, 8)])
def test_peak_activations_follow_the_schedules_theory(stages, micro):
    """GPipe holds all M microbatches at every stage; 1F1B at most min(S-s, M) (PipeDream-Flush's bound)."""
    gpipe, _ = _step("gpipe", {"stages": stages, "microbatches": micro, "batch_size": 32})
    one_f, _ = _step("1f1b", {"stages": stages, "microbatches": micro, "batch_size": 32})
    for extra in gpipe:
        assert extra["stages"] == list(range(stages)) and extra["peak_microbatches"] == [micro] * stages
        assert extra["peak_weight_bytes"] == [0] * stages
    for g, o in zip(gpipe, one_f, strict=True):
        assert o["peak_microbatches"] == [min(stages - s, micro) for s in range(stages)]
        for s in range(stages):  # equal microbatches hold equal bytes: bytes scale with the count held
            per = g["peak_activation_bytes"][s] / micro
            assert per > 0 and o["peak_activation_bytes"][s] == pytest.approx(per * min(stages - s, micro), rel=0.1)


def test_pipedream_stashes_at_most_s_minus_s_versions():
    extras, method = _step("pipedream", {"stages": 3, "partition": "uniform"}, steps=6)
    param_bytes = [method.stages[s].param_bytes for s in range(3)]
    steady = extras[-1]
    assert steady["peak_microbatches"] == [3, 2, 1]
    assert [w // b for w, b in zip(steady["peak_weight_bytes"], param_bytes, strict=True)] == [3, 2, 0]


def _stage(mode, last=False):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    return Stage(1 if not last else 1, 3 if not last else 2, module, optimizer, Live(module),
                 nn.functional.cross_entropy, backward_mode=mode)


@pytest.mark.parametrize("last", [False, True])
def test_current_mode_equals_graph_mode_bitwise_when_weights_did_not_change(last):
    torch.manual_seed(1)
    x, y, grad = torch.randn(5, 6), torch.randint(4, (5,)), torch.randn(5, 4)
    results = []
    for mode in ("graph", "current"):
        stage = _stage(mode, last)
        out = stage.forward((0, 0), x, y if last else None, 0.5)
        grad_in = stage.backward((0, 0), None if last else grad)
        grads = [p.grad.clone() for p in stage.module.parameters()]
        buffers = [b.clone() for b in stage.module.buffers()]
        # what the stage keeps for the backward: autograd's saved tensors and its input and output (buffers)
        results.append((out.detach(), grad_in, grads, buffers, stage.peak.activation_bytes + stage.peak.buffer_bytes))
    (out_g, in_g, grads_g, buf_g, mem_g), (out_c, in_c, grads_c, buf_c, mem_c) = results
    assert torch.equal(out_g, out_c) and torch.equal(in_g, in_c)
    assert all(torch.equal(a, b) for a, b in zip(grads_g, grads_c, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buf_g, buf_c, strict=True))  # BN statistics updated once
    assert mem_c == x.numel() * 4 < mem_g  # current mode keeps only the input


def test_current_mode_differentiates_the_weights_current_at_backward_time():
    torch.manual_seed(1)
    x, grad = torch.randn(5, 6), torch.randn(5, 4)
    stage = _stage("current")
    stage.forward((0, 0), x)
    with torch.no_grad():
        for p in stage.module.parameters():
            p.mul_(2)  # an update between the forward and the backward
    stage.backward((0, 0), grad)
    fresh = _stage("graph")
    with torch.no_grad():
        for p in fresh.module.parameters():
            p.mul_(2)
    fresh.forward((0, 0), x)
    fresh.backward((0, 0), grad)
    for a, b in zip(stage.module.parameters(), fresh.module.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
