"""2-Step GC: error feedback keeps sent + residual equal to the accumulated gradient; payloads match their layout;
Q-FB's bytes on the wire are the codecs' formulas."""

from __future__ import annotations

import math

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from methods.pipeline.core.codecs import make_codec
from methods.pipeline.qfb.two_step import SCALE_BYTES, TwoStep, index_width

STREAM = ("grad", 1, 1, 0)


@pytest.mark.parametrize("density", [0.01, 0.1, 0.5, 1.0])
def test_error_feedback_keeps_sent_plus_residual_equal_to_the_accumulated_gradient(density):
    codec = TwoStep(density)
    torch.manual_seed(0)
    total_in, total_sent = torch.zeros(8, 64), torch.zeros(8, 64)
    for _ in range(6):
        grad = torch.randn(8, 64)
        before = codec.residual(STREAM, grad.numel())
        accumulated = grad + (before.view_as(grad) if before is not None else 0)
        sent = codec.decode(codec.encode(grad, STREAM), grad.shape)
        after = codec.residual(STREAM, grad.numel()).view_as(grad)
        torch.testing.assert_close(sent + after, accumulated, rtol=0, atol=1e-6)
        total_in += grad
        total_sent += sent
    # telescoping: everything given is either delivered or still held
    torch.testing.assert_close(total_sent + codec.residual(STREAM, 512).view(8, 64), total_in, rtol=0, atol=1e-5)


def test_the_kept_entries_are_the_largest_and_quantized_within_a_half_step():
    codec = TwoStep(0.25)
    x = torch.tensor([0.1, -4.0, 0.3, 2.0, -0.05, 1.0, 0.2, -0.6])
    sent = codec.decode(codec.encode(x, STREAM), (8,))
    assert torch.equal(sent.nonzero().flatten(), torch.tensor([1, 3]))  # k = 2: -4.0 and 2.0
    assert (sent - x)[[1, 3]].abs().max() <= 4.0 / 254 + 1e-7
    assert sent[1] == -4.0  # the largest kept value sits on the grid (it defines the scale)


def test_without_feedback_nothing_is_carried():
    codec = TwoStep(0.1, feedback=False)
    codec.encode(torch.randn(100), STREAM)
    assert codec.residual(STREAM, 100) is None and codec.state_dict() == {"residuals": {}}


def _layout(codec: TwoStep, n: int) -> int:
    k = 0 if n == 0 else min(n, max(1, math.ceil(codec.density * n)))
    if k == n:
        index = 0
    else:
        index = min(math.ceil(n / 8), k * index_width(n))
    return SCALE_BYTES + index + k


@pytest.mark.parametrize("density", [0.001, 0.05, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("shape", [(1,), (7, 3), (100,), (8, 64), (300,), (70000,), (5, 0)])
def test_payloads_match_their_layout_and_round_trip(density, shape):
    codec = TwoStep(density)
    torch.manual_seed(1)
    x = torch.randn(shape)
    payload = codec.encode(x, STREAM)
    n = x.numel()
    assert payload.dtype == torch.uint8 and payload.numel() == codec.nbytes(n) == _layout(codec, n)
    y = codec.decode(payload.clone(), shape)
    assert y.shape == x.shape
    k = codec.kept(n)
    assert int((y != 0).sum()) <= k
    if n:
        kept = y != 0
        assert ((y - x)[kept].abs().max() if kept.any() else 0) <= x.abs().max() / 254 + 1e-6
        assert (y - x).abs().max() <= codec.error_bound(x) + 1e-6


def test_index_widths_and_the_bitmap_choice():
    assert [index_width(n) for n in (1, 256, 257, 65536, 65537)] == [1, 1, 2, 2, 4]
    assert TwoStep(0.1).uses_bitmap(512)  # 64 bytes of bitmap < 52 indices of 2 bytes
    assert not TwoStep(0.01).uses_bitmap(512)  # 6 indices of 2 bytes < 64
    assert TwoStep(0.1).nbytes(512) == 4 + 64 + 52
    assert TwoStep(1.0).nbytes(512) == 4 + 512  # nothing to index: int8 with one scale
    assert TwoStep(0.001).nbytes(70000) == 4 + 70 * 4 + 70


def test_residuals_are_kept_per_stream_and_size_and_survive_a_checkpoint():
    codec = TwoStep(0.1)
    codec.encode(torch.randn(64), STREAM)
    codec.encode(torch.randn(32), STREAM)
    codec.encode(torch.randn(64), ("grad", 2, 2, 1))
    assert len(codec.residuals) == 3
    restored = TwoStep(0.1)
    restored.load_state_dict(codec.state_dict())
    x = torch.randn(64)
    assert torch.equal(restored.encode(x, STREAM), codec.encode(x, STREAM))


def _qfb_bytes(rank, world_size, method, params, steps):
    cls, ctx = context(method, rank, world_size, params)
    m = cls(ctx)
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    for t in range(steps):
        m.train_step(Batch(t, 0.0, order.batch(t), data, 0))
    m.end_training()
    m.finish()
    by = ctx.comm.ledger.by_category()
    return by.get("activations", [0, 0])[0], by.get("activation_grads", [0, 0])[0]


@pytest.mark.slow
def test_qfb_bytes_on_the_wire_are_the_codecs_payloads():
    """digits-mlp on 2 ranks, 4 microbatches of 8: every message crosses the 128-wide boundary (1024 elements)."""
    steps, micro, n = 3, 4, 8 * 128
    gpipe = spawn(_qfb_bytes, 2, "gpipe", {"microbatches": micro}, steps)
    qfb = spawn(_qfb_bytes, 2, "qfb", {"microbatches": micro, "density": 0.1}, steps)
    assert gpipe[0][0] == steps * micro * 4 * n and gpipe[1][1] == steps * micro * 4 * n
    assert qfb[0][0] == steps * micro * make_codec("int8").nbytes(n)
    assert qfb[1][1] == steps * micro * TwoStep(0.1).nbytes(n)
    assert qfb[0][1] == 0 and qfb[1][0] == 0  # activations only go forward, gradients only back
