"""Local parallelism's overlapping variant: every block runs once per forward, the shared block learns from both
losses, and no gradient crosses into the blocks before a chunk's first (shared) block."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from _dist import context
from harness.data.tensors import Batch, DataOrder
from methods.local.parts import chunk_ranges

#: (workload, workload options, chunks). digits-resnet depth 8: the shared block 2 maps 16 -> 32 channels, so
#: running it twice fails; depth 20: the shared block 5 maps 32 -> 32 channels, so running it twice deepens the net.
CASES = [("digits-mlp", None, 2), ("digits-resnet", {"depth": 8}, 2), ("digits-resnet", None, 2),
         ("digits-resnet", {"depth": 8, "norm": "batch"}, 3)]


def _method(workload, options, chunks):
    cls, ctx = context("local", 0, 1, {"chunks": chunks, "variant": "overlapping"}, workload=workload,
                       options=options)
    return cls(ctx)


def _batch(method, step=0, batch_size=16):
    data = method.ctx.workload.train
    return Batch(step, 0.0, DataOrder(len(data), batch_size, seed=0).batch(step), data, 0)


def _model_blocks(method):
    """The model's blocks in order (each chunk's blocks are slices of one model)."""
    blocks = []
    for chunk in method.blocks:
        blocks += [b for b in chunk if all(b is not seen for seen in blocks)]
    return blocks


def _count_calls(blocks):
    calls = Counter()
    handles = [b.register_forward_hook(lambda m, i, o, k=k: calls.update([k])) for k, b in enumerate(blocks)]
    return calls, handles


def test_path_ranges():
    from methods.local.parts import path_ranges

    assert path_ranges(chunk_ranges(5, 2, "overlapping")) == [(0, 3), (3, 5)]
    assert path_ranges(chunk_ranges(11, 3, "overlapping")) == [(0, 4), (4, 8), (8, 11)]
    assert path_ranges(chunk_ranges(3, 3, "overlapping")) == [(0, 1), (1, 2), (2, 3)]
    assert path_ranges(chunk_ranges(5, 2, "chunked")) == chunk_ranges(5, 2, "chunked")


@pytest.mark.parametrize("workload,options,chunks", CASES)
def test_every_block_runs_once_per_forward(workload, options, chunks):
    method = _method(workload, options, chunks)
    blocks = _model_blocks(method)
    assert len(blocks) == method.ranges[-1][1]
    calls, handles = _count_calls(blocks)
    for step in range(2):
        method.train_step(_batch(method, step))
        assert calls == Counter(range(len(blocks))), f"train step {step}: calls per block {dict(calls)}"
        calls.clear()
    result = method.evaluate(method.ctx.workload.test)  # 360 test samples: one eval batch
    assert calls == Counter(range(len(blocks))), f"evaluate: calls per block {dict(calls)}"
    for h in handles:
        h.remove()
    assert len(result.extra["head_accuracy"]) == chunks


def _reference_grads(method, batch):
    """Per parameter, the sum over chunks of the gradient of chunk c's loss when chunk c runs its own blocks
    [start, end) on the detached input of its first block: the variant as the docs state it, computed here
    independently of the method's one-pass forward."""
    ranges, heads = method.ranges, copy.deepcopy(method.heads)
    blocks = copy.deepcopy(_model_blocks(method))
    loss_fn = method.ctx.workload.loss
    x, y = batch.inputs(), batch.targets()
    inputs = [x]  # inputs[b]: the input of block b on the network path
    with torch.no_grad():
        for block in blocks:
            inputs.append(block(inputs[-1]))
    grads = {}
    for c, (start, end) in enumerate(ranges):
        h = inputs[start].detach()
        for block in blocks[start:end]:
            h = block(h)
        params = [q for m in (*blocks[start:end], heads[c]) for q in m.parameters()]
        for q, g in zip(params, torch.autograd.grad(loss_fn(heads[c](h), y), params), strict=True):
            grads[id(q)] = grads.get(id(q), 0) + g
    return blocks, heads, grads


@pytest.mark.parametrize("workload,options,chunks", CASES[:2])
def test_shared_block_gets_both_losses_and_nothing_crosses(workload, options, chunks):
    method = _method(workload, options, chunks)
    batch = _batch(method)
    ref_blocks, ref_heads, ref = _reference_grads(method, batch)  # from the weights before the step
    method.train_step(batch)  # the step leaves its gradients in .grad
    shared = method.ranges[1][0]
    for block, ref_block in zip(_model_blocks(method), ref_blocks, strict=True):
        for q, r in zip(block.parameters(), ref_block.parameters(), strict=True):
            torch.testing.assert_close(q.grad, ref[id(r)], rtol=1e-5, atol=1e-7)
    # The shared block's gradient has both chunks' parts, each of them non-zero.
    ranges, blocks, x, y = method.ranges, ref_blocks, batch.inputs(), batch.targets()
    with torch.no_grad():
        u = x
        for block in blocks[:shared]:
            u = block(u)
    parts = []
    for c in (0, 1):
        h = u if c == 1 else x
        for block in blocks[shared:ranges[1][1]] if c == 1 else blocks[:ranges[0][1]]:
            h = block(h)
        parts.append(torch.autograd.grad(method.ctx.workload.loss(ref_heads[c](h), y),
                                         list(blocks[shared].parameters())))
    for g0, g1, r in zip(*parts, blocks[shared].parameters(), strict=True):
        assert g0.abs().sum() > 0 and g1.abs().sum() > 0
        torch.testing.assert_close(g0 + g1, ref[id(r)], rtol=1e-5, atol=1e-7)
        assert not torch.allclose(g0, ref[id(r)], rtol=1e-3, atol=0)  # chunk 1's loss adds to it


def test_no_gradient_reaches_blocks_before_the_shared_one():
    """Block 0 of digits-mlp belongs to chunk 0 only: changing chunk 1's other block leaves its gradient as it was
    (after one step; later steps differ through the shared block's weights, as they should)."""
    grads = []
    for perturb in (False, True):
        method = _method("digits-mlp", None, 2)
        if perturb:
            with torch.no_grad():
                for q in method.blocks[1][-1].parameters():
                    q.mul_(3.0)
        method.train_step(_batch(method))
        grads.append([torch.cat([q.grad.flatten() for q in method.blocks[0][b].parameters()]) for b in (0, 1)])
    assert torch.equal(grads[0][0], grads[1][0])
    assert not torch.equal(grads[0][1], grads[1][1])
