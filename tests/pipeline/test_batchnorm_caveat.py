"""The BatchNorm caveat of docs/methods.md: flushed pipelines (and ddp) equal sgd's gradient on BatchNorm-free
models only; with BatchNorm each microbatch (shard) is normalised with its own statistics, and the gradient is the
size-weighted mean of per-microbatch gradients, which this file computes independently."""

from __future__ import annotations

import copy

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder

BATCH, MICRO = 32, 4
#: The same ResNet-8 on digits, once with GroupNorm (no BatchNorm) and once with BatchNorm.
GROUP, BATCHNORM = {"depth": 8, "norm": "group"}, {"depth": 8, "norm": "batch"}


def _method(name, options, params=None, rank=0, world_size=1):
    cls, ctx = context(name, rank, world_size, {"batch_size": BATCH, "momentum": 0.0, **(params or {})},
                       workload="digits-resnet", options=options)
    return cls(ctx)


def _batch(method, step=0):
    data = method.ctx.workload.train
    return Batch(step, 0.0, DataOrder(len(data), BATCH, seed=0).batch(step), data, 0)


def _step_gradient(method):
    """Run one step and return the gradient its optimizers applied (read just before each optimizer step), in the
    model's parameter order (the optimizers are the stages' in order; the stages may step in any order)."""
    grads: dict[int, torch.Tensor] = {}

    def keep(optimizer, args, kwargs):
        grads[id(optimizer)] = torch.cat([p.grad.detach().flatten() for g in optimizer.param_groups
                                          for p in g["params"]])

    optimizers = method.optimizers()
    handles = [opt.register_step_pre_hook(keep) for opt in optimizers]
    method.train_step(_batch(method))
    for h in handles:
        h.remove()
    return torch.cat([grads[id(opt)] for opt in optimizers])


def _microbatch_mean_gradient(model, batch, parts):
    """Sum over the `parts` consecutive microbatches m (torch.tensor_split) of |m|/|B| * grad CE(model(x_m), y_m),
    each forward in train mode, so BatchNorm normalises with microbatch m's own statistics."""
    model = copy.deepcopy(model)
    x, y = batch.inputs(), batch.targets()
    for idx in torch.tensor_split(torch.arange(len(batch)), parts):
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx]) * len(idx) / len(batch)
        loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]), model


def _relative(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_flushed_pipeline_equals_sgd_without_batchnorm(name):
    sgd = _step_gradient(_method("sgd", GROUP))
    pipe = _step_gradient(_method(name, GROUP, {"stages": 2, "microbatches": MICRO}))
    torch.testing.assert_close(pipe, sgd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_flushed_pipeline_with_batchnorm_is_the_mean_of_microbatch_gradients(name):
    sgd_method = _method("sgd", BATCHNORM)
    initial = copy.deepcopy(sgd_method.model)  # the initial weights every method builds for this seed
    sgd = _step_gradient(sgd_method)
    pipe_method = _method(name, BATCHNORM, {"stages": 2, "microbatches": MICRO})
    pipe = _step_gradient(pipe_method)
    reference, stepped = _microbatch_mean_gradient(initial, _batch(pipe_method), MICRO)
    whole, _ = _microbatch_mean_gradient(initial, _batch(pipe_method), 1)
    torch.testing.assert_close(whole, sgd, rtol=1e-5, atol=1e-6)  # the reference's 1-part case is sgd's gradient
    torch.testing.assert_close(pipe, reference, rtol=1e-5, atol=1e-6)
    assert _relative(pipe, sgd) > 0.05  # measurably not sgd's (0.2 to 0.5 here)
    # The running statistics: one momentum update per microbatch, in microbatch order (both schedules run a stage's
    # forwards in order 0..M-1).
    pipe_buffers = [b for s in sorted(pipe_method.stages) for b in pipe_method.stages[s].module.buffers()]
    for mine, theirs in zip(pipe_buffers, stepped.buffers(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def _ddp_gradient(rank, world_size):
    method = _method("ddp", BATCHNORM, rank=rank, world_size=world_size)
    method.train_step(_batch(method))
    return (torch.cat([p.grad.flatten() for p in method.network.parameters()]),
            [b.clone() for b in method.network.buffers()])


@pytest.mark.slow
def test_ddp_with_batchnorm_is_the_mean_of_shard_gradients():
    results = spawn(_ddp_gradient, 2)
    sgd_method = _method("sgd", BATCHNORM)
    initial = copy.deepcopy(sgd_method.model)
    batch = _batch(sgd_method)
    sgd = _step_gradient(sgd_method)
    reference, _ = _microbatch_mean_gradient(initial, batch, 2)  # ddp's shards: contiguous halves
    for rank, (grad, buffers) in enumerate(results):
        torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6)
        assert _relative(grad, sgd) > 0.05
        # Each rank's running statistics come from its own shard (rank 0's overwrite them at the next forward).
        own = copy.deepcopy(initial)
        own(batch.inputs()[torch.tensor_split(torch.arange(BATCH), 2)[rank]])
        for mine, theirs in zip(buffers, own.buffers(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
