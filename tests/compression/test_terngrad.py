"""terngrad: ternary values, unbiasedness, clipping, shared scalers, the 2-bit payload, and a 2-rank DDP run."""

from __future__ import annotations

import math

import pytest
import torch

from _compress import gradient_patterns, layout
from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from methods.bits import unpack_bits
from methods.compression.terngrad import TernGradCompressor


def _round_trip(compressor: TernGradCompressor, grad: torch.Tensor) -> tuple[torch.Tensor, float]:
    compressed = compressor.compress(grad, "w")
    return compressor.decompress(compressed.payload, compressed.ctx), compressed.payload[1].item()


def test_decompressed_values_are_minus_s_zero_or_s_with_the_sign_of_g():
    torch.manual_seed(0)
    grad = torch.randn(1001) * 0.1
    grad[:10] = 0.0
    out, scaler = _round_trip(TernGradCompressor(), grad)
    assert scaler > 0
    assert set(out.unique().tolist()) <= {-scaler, 0.0, scaler}
    assert (out != 0).sum() > 100, "almost nothing was kept: the draw is broken"
    assert torch.all(out[:10] == 0), "zero gradients must stay zero"
    kept = out != 0
    assert torch.equal(torch.sign(out[kept]), torch.sign(grad[kept]))


@pytest.mark.parametrize("clip_c", [None, 2.5])
def test_ternarization_is_unbiased_where_nothing_is_clipped(clip_c):
    # Uniform entries: max|g| = 1 < 2.5σ ≈ 1.44, so with clipping on, s = max|g| and nothing is clipped either.
    torch.manual_seed(1)
    grad = torch.rand(1000) * 2 - 1
    compressor = TernGradCompressor(clip_c=clip_c)
    draws = 2000
    total = torch.zeros_like(grad, dtype=torch.float64)
    scalers = set()
    for _ in range(draws):
        out, scaler = _round_trip(compressor, grad)
        total += out
        scalers.add(scaler)
    (scaler,) = scalers
    assert scaler == pytest.approx(grad.abs().max().item())
    mean = total / draws
    # Each draw is s·sign(g)·Bernoulli(|g|/s): variance s|g| - g².
    g = grad.double()
    standard_error = ((scaler * g.abs() - g * g).clamp(min=0) / draws).sqrt()
    error = (mean - g).abs()
    worst = (error / (standard_error + 1e-12)).max()
    assert torch.all(error <= 5 * standard_error + 1e-6), f"worst error {worst:.1f} standard errors"


def test_clipping_maps_entries_beyond_c_sigma_to_plus_minus_s():
    torch.manual_seed(2)
    grad = torch.randn(10_000)
    outliers = torch.tensor([40.0, -40.0, 30.0, -30.0, 25.0])
    grad[:5] = outliers
    compressor = TernGradCompressor(clip_c=2.5)
    expected = 2.5 * torch.std(grad, correction=0).item()
    for _ in range(20):
        out, scaler = _round_trip(compressor, grad)
        assert scaler == pytest.approx(expected, rel=1e-5)
        clipped = grad.abs() > scaler
        assert clipped.sum() > 5  # the outliers and the far tail of the normal
        assert torch.equal(out[clipped], torch.sign(grad[clipped]) * scaler)
    # clip_c = 0 or None disables clipping: s = max|g|
    for off in (0.0, None):
        _, scaler = _round_trip(TernGradCompressor(clip_c=off), grad)
        assert scaler == 40.0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 257, 1000, 4099])
def test_payload_size_depends_only_on_numel(n):
    patterns = gradient_patterns(n)
    compressor = TernGradCompressor()
    layouts = set()
    for name, grad in patterns.items():
        compressed = compressor.compress(grad, "w")
        assert compressed.nbytes == math.ceil(n / 4) + 4, name
        layouts.add(layout(compressed))
        # The byte-table decode equals decoding unpacked codes one by one (0 -> 0, 1 -> +s, 2 -> -s).
        packed, scaler = compressed.payload
        by_code = torch.tensor([0.0, 1.0, -1.0, 0.0])[unpack_bits(packed, 2, n).long()] * scaler
        assert torch.equal(compressor.decompress(compressed.payload, compressed.ctx), by_code), name
    assert len(layouts) == 1


def _shared_scalers(rank: int, world_size: int, share: bool):
    import torch.distributed as dist

    from harness.comm.communicator import Communicator

    torch.manual_seed(10 + rank)
    # layer a is larger on rank 0, layer b on rank 1, so the max comes from a different rank per layer
    named = [("a", torch.randn(500) * (3.0 if rank == 0 else 1.0)),
             ("b", torch.randn(300) * (1.0 if rank == 0 else 5.0))]
    compressor = TernGradCompressor(clip_c=2.5, share_scalers=share)
    local = [compressor.local_scaler(grad) for _, grad in named]
    compressor.prepare(named, Communicator(rank, world_size, dist.group.WORLD))
    used = []
    for name, grad in named:
        compressed = compressor.compress(grad, name)
        out = compressor.decompress(compressed.payload, compressed.ctx)
        used.append(compressed.payload[1].item())
        assert set(out.unique().tolist()) <= {-used[-1], 0.0, used[-1]}
    return local, used


@pytest.mark.slow
def test_shared_scalers_are_the_max_over_two_processes():
    (local0, used0), (local1, used1) = spawn(_shared_scalers, 2, True)
    assert local0 != local1
    assert used0 == used1
    assert used0 == [max(a, b) for a, b in zip(local0, local1, strict=True)]
    assert used0[0] == local0[0] and used0[1] == local1[1]
    # without sharing each rank keeps its own scaler
    (local0, used0), (local1, used1) = spawn(_shared_scalers, 2, False)
    assert used0 == local0 and used1 == local1


def _terngrad_run(rank: int, world_size: int, params: dict, steps: int):
    cls, ctx = context("terngrad", rank, world_size, {"batch_size": 32, **params})
    method = cls(ctx)
    torch.manual_seed(ctx.seed + 1 + rank)  # as the runner does: each rank draws its own uniforms
    order = DataOrder(len(ctx.workload.train), 32, seed=0)
    history, extras = [], []
    for step in range(steps):
        stats = method.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
        extras.append(stats.extra)
        history.append(torch.cat([p.detach().flatten() for p in method.model.module.parameters()]))
    sizes = {n: p.numel() for n, p in method.model.module.named_parameters()}
    last_block = str(len(method.model.module) - 1)
    return (history, extras, sorted(method.hook.dense), sizes, last_block, method.optimizer.defaults["momentum"],
            ctx.comm.ledger.by_category()["gradients"][0])


@pytest.mark.slow
@pytest.mark.parametrize("params", [{}, {"share_scalers": False, "compress_last_layer": True}],
                         ids=["default", "options"])
def test_two_rank_ddp_keeps_ranks_identical_and_reports_the_payload_ratio(params):
    steps = 5
    share, last_dense = params.get("share_scalers", True), not params.get("compress_last_layer", False)
    results = spawn(_terngrad_run, 2, params, steps)
    (history0, extras0, dense, sizes, last_block, momentum, sent0), (history1, *_rest) = results
    assert momentum == 0.9  # the workload's momentum: TernGrad runs momentum SGD on the ternary gradients
    for step, (p0, p1) in enumerate(zip(history0, history1, strict=True)):
        assert torch.equal(p0, p1), f"ranks differ after step {step + 1}"
    assert not torch.equal(history0[0], history0[-1])
    # Dense: the logits block (unless compress_last_layer) and tensors under 256 elements; the rest ternary:
    # ceil(n/4) bytes of codes plus a 4-byte scaler.
    expected_dense = sorted(n for n, size in sizes.items()
                            if (last_dense and n.startswith(last_block + ".")) or size < 256)
    assert dense == expected_dense
    compressed = [n for n in sizes if n not in dense]
    assert compressed == ["0.1.weight", "1.0.weight"] + ([] if last_dense else ["2.0.weight"])
    payload = sum(4 * sizes[n] for n in dense) + sum(math.ceil(sizes[n] / 4) + 4 for n in compressed)
    dense_bytes = 4 * sum(sizes.values())
    for extra in extras0:
        assert extra["payload_bytes"] == payload
        assert extra["dense_bytes"] == dense_bytes
        assert extra["compression_ratio"] == pytest.approx(dense_bytes / payload)
    # The ledger: per step, one all-gather of the payload ((W-1)·payload sent), plus the scaler all-reduce when
    # shared (ring: 2(W-1)/W · 4 bytes per compressed layer); digits-mlp fits in one DDP bucket.
    scaler_bytes = 4 * len(compressed) if share else 0
    assert sent0 == steps * (payload + scaler_bytes)


def test_a_non_fp32_gradient_is_refused_by_name():
    with pytest.raises(TypeError, match="'layer.weight'.*float16"):
        TernGradCompressor().compress(torch.zeros(8, dtype=torch.float16), "layer.weight")
