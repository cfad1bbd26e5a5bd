"""ddp: its gradient on a global batch equals sgd's, and every rank holds identical parameters after every step."""

from __future__ import annotations

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder

pytestmark = pytest.mark.slow


def _ddp_grads_and_params(rank: int, world_size: int, steps: int):
    cls, ctx = context("ddp", rank, world_size, {"batch_size": 32, "lr": 0.05, "momentum": 0.9})
    method = cls(ctx)
    order = DataOrder(len(ctx.workload.train), 32, seed=0)
    first_grads, param_history = None, []
    for step in range(steps):
        method.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
        if first_grads is None:
            first_grads = [p.grad.clone() for p in method.model.module.parameters()]
        param_history.append(torch.cat([p.detach().flatten() for p in method.model.module.parameters()]))
    return first_grads, param_history, ctx.comm.ledger.by_category()


def test_ddp_gradient_equals_sgd_and_ranks_stay_identical():
    results = spawn(_ddp_grads_and_params, 2, 5)
    cls, ctx = context("sgd", 0, 1, {"batch_size": 32, "lr": 0.05, "momentum": 0.9})
    sgd = cls(ctx)
    order = DataOrder(len(ctx.workload.train), 32, seed=0)
    sgd.train_step(Batch(0, 0.0, order.batch(0), ctx.workload.train, 0))
    sgd_grads = [p.grad for p in sgd.model.parameters()]
    for grads, _, _ in results:
        for g_ddp, g_sgd in zip(grads, sgd_grads, strict=True):
            torch.testing.assert_close(g_ddp, g_sgd, rtol=1e-5, atol=1e-6)
    (_, history0, bytes0), (_, history1, _) = results
    for step, (p0, p1) in enumerate(zip(history0, history1, strict=True)):
        assert torch.equal(p0, p1), f"ranks differ after step {step + 1}"
    # The hook's accounting: each step all-reduces every gradient once (fp32, W=2: 2(W-1)/W * n = n).
    n_params = sum(p.numel() for p in sgd.model.parameters())
    assert bytes0["gradients"] == [5 * 4 * n_params, 5 * 4 * n_params]
