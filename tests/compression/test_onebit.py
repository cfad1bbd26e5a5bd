"""onebit: error feedback carries exactly what was not sent, two means per tensor, 1 bit per element, 2-rank DDP."""

from __future__ import annotations

import math

import pytest
import torch

from _compress import gradient_patterns, layout
from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from methods.bits import pack_bits, unpack_bits
from methods.compression.core import ErrorFeedback
from methods.compression.onebit import OneBitCompressor


def _round_trip(compressor: OneBitCompressor, values: torch.Tensor) -> torch.Tensor:
    compressed = compressor.compress(values, "w")
    return compressor.decompress(compressed.payload, compressed.ctx)


@pytest.mark.parametrize("n", [1000, 1003])
def test_error_feedback_sends_everything_eventually(n):
    torch.manual_seed(0)
    compressor, memory = OneBitCompressor(), ErrorFeedback()
    param = torch.zeros(n)
    sent_total = torch.zeros(n, dtype=torch.float64)
    grad_total = torch.zeros(n, dtype=torch.float64)
    for step in range(8):
        grad = torch.randn(n) + 0.3 * step  # a drifting mean, so both sides and their sizes change
        compensated = memory.compensate(grad, "w", param)
        compressed = compressor.compress(compensated, "w")
        memory.update(compensated, "w", compressor, compressed)
        sent = compressor.decompress(compressed.payload, compressed.ctx)
        residual = memory.residuals["w"]
        assert residual.abs().max() > 0.1, "nothing was lost in quantization: the test would be vacuous"
        torch.testing.assert_close(sent + residual, compensated, rtol=0, atol=1e-6)
        sent_total += sent.double()
        grad_total += grad.double()
    torch.testing.assert_close(sent_total + residual.double(), grad_total, rtol=0, atol=1e-5)


def test_each_element_decodes_to_the_mean_of_its_side():
    torch.manual_seed(1)
    values = torch.randn(5001) + 0.2
    values[:7] = 0.0  # zeros count as non-negative
    out = _round_trip(OneBitCompressor(), values)
    nonnegative = values >= 0
    assert out.unique().numel() == 2
    assert torch.all(out[nonnegative] == out[nonnegative][0])
    assert torch.all(out[~nonnegative] == out[~nonnegative][0])
    assert out[nonnegative][0].item() == pytest.approx(values[nonnegative].double().mean().item(), rel=1e-6)
    assert out[~nonnegative][0].item() == pytest.approx(values[~nonnegative].double().mean().item(), rel=1e-6)
    # A side with few members gets its own mean, however lopsided the tensor.
    lopsided = torch.rand(100_000) + 1000.0
    lopsided[123] = -1e-3
    out = _round_trip(OneBitCompressor(), lopsided)
    assert out[123].item() == pytest.approx(-1e-3, rel=1e-6)


@pytest.mark.parametrize("values", [torch.rand(300) + 0.1, -torch.rand(300) - 0.1, torch.zeros(300)],
                         ids=["positive", "negative", "zeros"])
def test_one_sided_tensors_take_one_value_and_no_nan(values):
    out = _round_trip(OneBitCompressor(), values)
    assert torch.isfinite(out).all()
    assert out.unique().numel() == 1
    assert out[0].item() == pytest.approx(values.double().mean().item(), rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 257, 1000, 4099])
def test_payload_is_one_bit_per_element_and_matches_pack_bits(n):
    patterns = gradient_patterns(n)
    compressor = OneBitCompressor()
    layouts = set()
    for name, values in patterns.items():
        compressed = compressor.compress(values, "w")
        assert compressed.nbytes == math.ceil(n / 8) + 8, name
        layouts.add(layout(compressed))
        packed, means = compressed.payload
        assert torch.equal(packed, pack_bits(values < 0, 1)), name
        by_bit = torch.where(unpack_bits(packed, 1, n).bool(), means[1], means[0])
        assert torch.equal(compressor.decompress(compressed.payload, compressed.ctx), by_bit), name
    assert len(layouts) == 1


def _onebit_run(rank: int, world_size: int, steps: int):
    cls, ctx = context("onebit", rank, world_size, {"batch_size": 32})
    method = cls(ctx)
    torch.manual_seed(ctx.seed + 1 + rank)
    order = DataOrder(len(ctx.workload.train), 32, seed=0)
    history, extras = [], []
    for step in range(steps):
        stats = method.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
        extras.append(stats.extra)
        history.append(torch.cat([p.detach().flatten() for p in method.model.module.parameters()]))
    sizes = {n: p.numel() for n, p in method.model.module.named_parameters()}
    residuals = {n: r.abs().max().item() for n, r in method.memory.residuals.items()}
    return history, extras, sorted(method.hook.dense), sizes, residuals, method.optimizer.defaults["momentum"]


@pytest.mark.slow
def test_two_rank_ddp_keeps_ranks_identical_and_carries_residuals():
    steps = 5
    (history0, extras0, dense, sizes, residuals0, momentum), (history1, _, _, _, residuals1, _) = spawn(
        _onebit_run, 2, steps)
    assert momentum == 0.9
    for step, (p0, p1) in enumerate(zip(history0, history1, strict=True)):
        assert torch.equal(p0, p1), f"ranks differ after step {step + 1}"
    assert not torch.equal(history0[0], history0[-1])
    assert dense == sorted(n for n, size in sizes.items() if size < 256)
    compressed = [n for n in sizes if n not in dense]
    assert compressed == ["0.1.weight", "1.0.weight", "2.0.weight"]
    # error feedback holds a residual for every compressed tensor (and only those), different on each rank
    assert sorted(residuals0) == sorted(compressed) and all(r > 0 for r in residuals0.values())
    assert residuals0 != residuals1
    payload = sum(4 * sizes[n] for n in dense) + sum(math.ceil(sizes[n] / 8) + 8 for n in compressed)
    for extra in extras0:
        assert extra["payload_bytes"] == payload
        assert extra["compression_ratio"] == pytest.approx(4 * sum(sizes.values()) / payload)


def test_a_non_fp32_gradient_is_refused_by_name():
    with pytest.raises(TypeError, match="'layer.weight'.*float16"):
        OneBitCompressor().compress(torch.zeros(8, dtype=torch.float16), "layer.weight")
