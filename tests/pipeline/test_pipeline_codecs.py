"""Wire codecs between pipeline stages: layouts, round-trip errors, bytes on the wire, and training with int8."""

from __future__ import annotations

import typing

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from methods.pipeline.core.codecs import CODECS, make_codec
from methods.pipeline.core.params import CodecName


def test_every_codec_is_offered_as_a_parameter():
    assert set(typing.get_args(CodecName)) == set(CODECS)
    with pytest.raises(ValueError, match="unknown codec 'int2'"):
        make_codec("int2")


@pytest.mark.parametrize("name,bytes_per_element,bound", [
    ("none", 4, 0.0), ("fp16", 2, 2.0**-11), ("int8", 1, 1 / 254), ("int4", 0.5, 1 / 14)])
@pytest.mark.parametrize("shape", [(1,), (7, 3), (32, 16, 4, 4), (5, 0)])
def test_codecs_round_trip_within_their_documented_error_and_layout(name, bytes_per_element, bound, shape):
    codec = make_codec(name)
    torch.manual_seed(0)
    x = torch.randn(shape) * 3
    payload = codec.encode(x)
    numel = x.numel()
    assert payload.dtype == torch.uint8 and payload.numel() == codec.nbytes(numel)
    scale_bytes = 4 if name in ("int8", "int4") else 0
    assert codec.nbytes(numel) == scale_bytes + -(-int(numel * bytes_per_element * 8) // 8)
    y = codec.decode(payload.clone(), shape)
    assert y.shape == x.shape and y.dtype == torch.float32
    if numel:
        error = (y - x).abs().max().item()
        assert error <= codec.error_bound(x) + 1e-7
        assert codec.error_bound(x) == pytest.approx(bound * x.abs().max().item(), rel=1e-6)


def test_linear_codecs_are_deterministic_and_exact_on_their_grid():
    codec = make_codec("int4")
    x = torch.tensor([-7.0, -3.0, 0.0, 1.0, 7.0]) / 7 * 2.5  # on the grid of scale 2.5
    torch.testing.assert_close(codec.decode(codec.encode(x), (5,)), x, rtol=0, atol=1e-6)
    assert torch.equal(codec.encode(x), codec.encode(x.clone()))
    assert torch.equal(codec.decode(codec.encode(torch.zeros(4)), (4,)), torch.zeros(4))


def _bytes(rank, world_size, codec, steps):
    cls, ctx = context("gpipe", rank, world_size, {"microbatches": 4, "activation_codec": codec,
                                                   "gradient_codec": codec})
    method = cls(ctx)
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    for t in range(steps):
        method.train_step(Batch(t, 0.0, order.batch(t), data, 0))
    method.finish()
    by = ctx.comm.ledger.by_category()
    return by.get("activations", [0, 0])[0] + by.get("activation_grads", [0, 0])[0]


@pytest.mark.slow
def test_int8_moves_at_most_027_of_fp32s_stage_to_stage_bytes():
    fp32 = sum(spawn(_bytes, 2, "none", 3))
    int8 = sum(spawn(_bytes, 2, "int8", 3))
    assert fp32 == 3 * 4 * 2 * (8 * 128 * 4)  # 3 steps x 4 microbatches x both ways x 8 rows x 128 floats
    assert int8 / fp32 <= 0.27 and int8 == 3 * 4 * 2 * (4 + 8 * 128)


def _accuracy(params, epochs=3):
    cls, ctx = context("gpipe", 0, 1, {"stages": 2, "microbatches": 4, **params})
    method = cls(ctx)
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    for t in range(epochs * order.steps_per_epoch):
        method.train_step(Batch(t, 0.0, order.batch(t), data, 0))
    return method.evaluate(ctx.workload.test).accuracy


@pytest.mark.slow
def test_int8_activations_and_gradients_train_as_well_as_fp32_on_digits():
    fp32 = _accuracy({})
    int8 = _accuracy({"activation_codec": "int8", "gradient_codec": "int8"})
    assert abs(int8 - fp32) <= 0.01 and fp32 > 0.9
