"""PowerSGD (torch's powerSGD_hook written out, counted): it trains exactly as torch's hook does, its payload per step
is (n + m)·r per matrix plus the tensors it leaves uncompressed, its warm-up sends the dense gradients, its error
feedback is the paper's e <- (g + e) - M', what its callbacks held is let go of after the backward, and a run resumed
from a checkpoint continues as an uninterrupted one."""

from __future__ import annotations

import io

import pytest
import torch

from _dist import context, spawn
from methods.compression.powersgd import PowerSGDParams, powersgd_payload_numel


def test_payload_formula():
    # (64, 32) at r = 2: (64 + 32)·2 = 192 < 2048 / 2, compressed; a bias (64,) is 64 x 1: r' = 1 and 65 > 64 / 2,
    # sent whole; (10, 64): 148 < 640 / 2, compressed; (3, 3): r' = 2, 12 > 9 / 2, whole; (8, 4, 3, 3) is 8 x 36:
    # (8 + 36)·2 = 88 < 288 / 2, compressed, but not at a minimum rate of 4 (88 > 288 / 4).
    assert powersgd_payload_numel([(64, 32)], 2, 2.0) == 192
    assert powersgd_payload_numel([(64,)], 2, 2.0) == 64
    assert powersgd_payload_numel([(64, 32), (64,), (10, 64), (3, 3)], 2, 2.0) == 192 + 64 + 148 + 9
    assert powersgd_payload_numel([(8, 4, 3, 3)], 2, 2.0) == 88
    assert powersgd_payload_numel([(8, 4, 3, 3)], 2, 4.0) == 288
    assert powersgd_payload_numel([(8, 4, 3, 3)], 1, 2.0) == 44
    assert powersgd_payload_numel([(64, 32)], 2, 20.0) == 64 * 32  # 2048 / 192 < 20: not worth it


def test_a_warm_up_too_short_for_error_feedback_is_refused():
    with pytest.raises(ValueError, match="start_iter must be at least 2"):
        PowerSGDParams(start_iter=1)
    assert PowerSGDParams(start_iter=1, use_error_feedback=False, warm_start=False).start_iter == 1


def _run(rank, world_size, params, steps, resume_at=None, torch_hook=False):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    from harness.data.tensors import Batch, DataOrder
    from methods.compression import powersgd as module
    from methods.compression.retire import Retired

    checks = []
    original = module.powersgd_hook
    held_after_backward = []

    def checked(state, bucket, retired):  # the paper's error feedback, checked on what the hook did
        compressed = state.iter >= state.start_powerSGD_iter
        index = bucket.index()
        before = bucket.buffer().detach().clone()
        error = state.error_dict.get(index)
        error = torch.zeros_like(before) if error is None else error.clone()
        fut = powerSGD_hook(state, bucket) if torch_hook else original(state, bucket, retired)

        def after(f):
            out = f.value()
            if compressed:
                checks.append(float((state.error_dict[index] - (before + error - out)).abs().max()))
            return out

        return fut.then(after)

    module.powersgd_hook = checked
    cls, ctx = context("powersgd", rank, world_size, params)
    method = cls(ctx)

    def counted_release():
        held_after_backward.append(len(method.retired))
        Retired.release(method.retired)
        assert len(method.retired) == 0

    method.retired.release = counted_release
    order = DataOrder(len(ctx.workload.train), 32, seed=0)
    history, extras = [], []
    for step in range(steps):
        if step == resume_at:
            buffer = io.BytesIO()
            torch.save(method.state_dict(), buffer)
            buffer.seek(0)
            _, ctx2 = context("powersgd", rank, world_size, params, seed=1)  # another seed: all must come back
            method = cls(ctx2)
            method.load_state_dict(torch.load(buffer, weights_only=True))
            method.retired.release = counted_release
        stats = method.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
        history.append(torch.cat([p.detach().flatten() for p in method.model.module.parameters()]))
        extras.append(stats.extra)
    shapes = [tuple(p.shape) for p in method.model.module.parameters()]
    module.powersgd_hook = original
    return history, extras, ctx.comm.ledger.by_category(), shapes, checks, held_after_backward


@pytest.mark.slow
def test_the_hook_trains_exactly_as_torchs_powersgd_hook():
    params = {"rank": 2, "start_iter": 2}
    ours = spawn(_run, 2, params, 5)
    torchs = spawn(_run, 2, params, 5, None, True)
    for rank in range(2):
        for step, (a, b) in enumerate(zip(ours[rank][0], torchs[rank][0], strict=True)):
            assert torch.equal(a, b), f"rank {rank}: our hook and torch's differ after step {step + 1}"
    # warm-up steps hold nothing; a compressed step's bag and its sent cat are held until the backward's end
    assert ours[0][5][:2] == [0, 0] and all(n > 0 for n in ours[0][5][2:])


@pytest.mark.slow
def test_powersgd_counts_its_bytes_keeps_ranks_equal_and_feeds_back_its_error():
    params = {"rank": 2, "start_iter": 2}
    (h0, extras, by_cat, shapes, checks, _), (h1, *_) = spawn(_run, 2, params, 5)
    for step, (a, b) in enumerate(zip(h0, h1, strict=True)):
        assert torch.equal(a, b), f"ranks differ after step {step + 1}"
    dense = 4 * sum(torch.Size(s).numel() for s in shapes)
    compressed = 4 * powersgd_payload_numel(shapes, 2, 2.0)
    assert [e["payload_bytes"] for e in extras] == [dense, dense, compressed, compressed, compressed]
    assert all(e["dense_bytes"] == dense and e["collective"] == "all_reduce" for e in extras)
    assert compressed < dense / 10
    # 2 ranks: a ring all-reduce moves what each rank hands over
    assert by_cat["gradients"][0] == sum(e["payload_bytes"] for e in extras)
    assert len(checks) >= 3 and max(checks) < 1e-6  # e_new = (g + e_old) - M' on every compressed bucket


@pytest.mark.slow
def test_a_resumed_powersgd_run_continues_as_an_uninterrupted_one():
    params = {"rank": 2, "start_iter": 2}
    straight = spawn(_run, 2, params, 6)
    resumed = spawn(_run, 2, params, 6, 4)
    for rank in range(2):
        for step, (a, b) in enumerate(zip(straight[rank][0], resumed[rank][0], strict=True)):
            assert torch.equal(a, b), f"rank {rank} differs after step {step + 1}"


def _several_buckets(rank, world_size, steps):
    from harness.data.tensors import Batch, DataOrder

    options = {"in_features": 256, "hidden": 1024, "depth": 2, "num_train": 512, "num_test": 64}
    cls, ctx = context("powersgd", rank, world_size, {"rank": 2, "start_iter": 2}, workload="synthetic-mlp",
                       options=options)
    method = cls(ctx)
    order = DataOrder(len(ctx.workload.train), 64, seed=0)
    for step in range(steps):
        method.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
    buckets = len(method.per_parameter.layouts)
    return torch.cat([p.detach().flatten() for p in method.model.module.parameters()]), buckets


@pytest.mark.slow
def test_several_buckets_keep_the_ranks_collectives_in_one_order():
    """A 1.3M-parameter MLP fills two DDP buckets; torch's hook alone issues their P and Q all-reduces from future
    callbacks in an order that can differ between gloo ranks (a size-mismatch abort, or a hang); the method starts a
    bucket once the last one is done, and the ranks end equal."""
    (a, buckets), (b, _) = spawn(_several_buckets, 2, 6)
    assert buckets >= 2
    assert torch.equal(a, b)
