"""QSGD's defining properties: unbiased, variance within the paper's bound, exact packing, levels and sizes."""

from __future__ import annotations

import math

import pytest
import torch

from methods.compression.qsgd import QSGDCompressor, QSGDParams, elias_gamma_bits


def roundtrip(c: QSGDCompressor, g: torch.Tensor) -> torch.Tensor:
    out = c.compress(g, "g")
    return c.decompress(out.payload, out.ctx)


@pytest.mark.parametrize("bits,d", [(2, 128), (4, 512), (8, 512)])
def test_unbiased_within_a_statistical_bound(bits, d):
    torch.manual_seed(0)
    g = torch.randn(1000)
    c = QSGDCompressor(bits, d)
    n_draws = 4000
    mean = torch.stack([roundtrip(c, g) for _ in range(n_draws)]).mean(0)
    # Each coordinate is scale/s * (l or l+1), l+1 with probability p = frac(s|g|/scale): its exact standard
    # deviation is scale/s * sqrt(p(1-p)). Every coordinate's mean must be within 6 standard errors of g
    # (a biased quantizer, e.g. round-to-nearest, fails this on most coordinates).
    s = (1 << (bits - 1)) - 1
    scale = torch.cat([g, g.new_zeros((-len(g)) % d)]).view(-1, d).norm(dim=1).repeat_interleave(d)[: len(g)]
    r = s * g.abs() / scale
    p = r - r.floor()
    se = scale / s * torch.sqrt(p * (1 - p)) / math.sqrt(n_draws)
    assert ((mean - g).abs() <= 6 * se + 1e-6).all(), ((mean - g).abs() / (se + 1e-12)).max()


@pytest.mark.parametrize("bits,d", [(2, 128), (4, 512), (8, 512), (4, 64)])
def test_variance_within_the_papers_bound(bits, d):
    torch.manual_seed(1)
    s = (1 << (bits - 1)) - 1
    g = torch.randn(4 * d) * torch.rand(4 * d)  # uneven magnitudes
    c = QSGDCompressor(bits, d)
    err = torch.stack([((roundtrip(c, g) - g) ** 2).view(4, d).sum(1) for _ in range(500)]).mean(0)
    bound = min(d / s**2, math.sqrt(d) / s) * (g.view(4, d) ** 2).sum(1)
    assert (err <= bound * 1.05).all(), (err, bound)  # 5% slack for the Monte Carlo estimate


def test_levels_signs_scales_and_payload_size():
    c = QSGDCompressor(4, 8)
    g = torch.tensor([3.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])  # two buckets, the second partial
    out = c.compress(g, "g")
    packed, scale = out.payload
    assert packed.numel() == 5 and scale.tolist() == [5.0, 1.0]  # 10 codes at 4 bits; one l2 norm per bucket
    q = c.decompress(out.payload, out.ctx)
    levels = (q[:8].abs() / 5.0 * 7).round()
    assert torch.allclose(q[:8].abs(), levels * 5.0 / 7)  # on the grid of 7 levels
    assert q[1] <= 0 and q[0] >= 0 and q[2:8].eq(0).all() and q[8] == 1.0  # signs kept; zeros stay zero
    assert out.nbytes == 5 + 2 * 4


def test_payload_size_depends_on_numel_only_and_compression_ratio():
    c = QSGDCompressor(4, 512)
    sizes = {c.compress(torch.randn(10_000) * s, "g").nbytes for s in (1e-3, 1.0, 1e3)}
    assert sizes == {5000 + 20 * 4}
    assert 40_000 / sizes.pop() > 6  # 4-bit: ~7.9x against fp32


def test_max_norm_and_zero_tensor():
    c = QSGDCompressor(8, 16, norm="max")
    g = torch.randn(64)
    q = roundtrip(c, g)
    assert q.abs().max() <= g.abs().max() + 1e-6
    assert torch.equal(roundtrip(c, torch.zeros(40)), torch.zeros(40))


def test_paper_bucket_defaults_and_elias():
    assert QSGDParams(bits=2).bucket_size == 128 and QSGDParams(bits=4).bucket_size == 512
    assert QSGDParams(bits=8, bucket_size=64).bucket_size == 64
    assert elias_gamma_bits(torch.tensor([1, 2, 3, 4])) == 1 + 3 + 3 + 5
    c = QSGDCompressor(2, 128, report_elias=True)
    roundtrip(c, torch.randn(1280))
    assert 0 < c.elias_bits / c.elements < 32
