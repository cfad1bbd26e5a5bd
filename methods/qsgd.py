"""QSGD (Alistarh et al., NeurIPS 2017): stochastic unbiased quantization of gradients to s levels per bucket."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from harness.data import Batch
from harness.method import StepStats
from methods.compression.core import Compressed, Compressor
from methods.compression.method import CompressedDDP, CompressionParams
from methods.compression.packing import pack_bits, unpack_bits


def elias_gamma_bits(values: torch.Tensor) -> int:
    """Total length in bits of the Elias gamma codes of positive integers: 2*floor(log2 x) + 1 each."""
    if values.numel() == 0:
        return 0
    return int((2 * torch.floor(torch.log2(values.double())) + 1).sum().item())


class QSGDCompressor(Compressor):
    """Q_s(v_i) = ||v|| * sgn(v_i) * xi_i / s per bucket of d consecutive values, xi_i = l or l+1 with
    P(l+1) = s|v_i|/||v|| - l, so E[Q_s(v)] = v. Each value travels as a `bits`-wide code, one sign bit and
    bits-1 level bits (s = 2^(bits-1) - 1 levels: 1, 7, 127), plus one fp32 scale per bucket."""

    def __init__(self, bits: int, bucket_size: int, norm: str = "l2", report_elias: bool = False):
        self.bits = bits
        self.levels = (1 << (bits - 1)) - 1
        self.bucket_size = bucket_size
        self.norm = norm
        self.report_elias = report_elias
        self.elias_bits = 0
        self.elements = 0

    def compress(self, tensor: torch.Tensor, name: str) -> Compressed:
        n, d = tensor.numel(), self.bucket_size
        buckets = -(-n // d)
        v = tensor.detach().reshape(-1).float()
        if buckets * d != n:
            v = torch.cat([v, v.new_zeros(buckets * d - n)])
        v = v.view(buckets, d)
        scale = v.norm(dim=1) if self.norm == "l2" else v.abs().amax(dim=1)
        # r = s|v_i|/||v||, in [0, s]; level = floor(r + u), u ~ U[0, 1): l+1 with probability r - l.
        inv = torch.where(scale > 0, self.levels / scale, torch.zeros_like(scale))
        r = v.abs().mul_(inv.unsqueeze(1))
        r.add_(torch.rand_like(r)).floor_().clamp_(max=self.levels)
        codes = r.to(torch.uint8)
        if self.report_elias:
            self._count_elias(codes, buckets)
        codes |= (v < 0).to(torch.uint8) << (self.bits - 1)
        return Compressed([pack_bits(codes.view(-1)[:n], self.bits), scale], n)  # padding is not sent

    def decompress(self, payload: list[torch.Tensor], ctx: Any) -> torch.Tensor:
        packed, scale = payload
        n = ctx
        buckets = scale.numel()
        codes = unpack_bits(packed, self.bits, n)
        if buckets * self.bucket_size != n:
            codes = torch.cat([codes, codes.new_zeros(buckets * self.bucket_size - n)])
        codes = codes.view(buckets, self.bucket_size)
        # A lookup table from code to signed level: code = sign << (bits-1) | level.
        table = torch.arange(1 << self.bits, dtype=torch.float32)
        table = torch.where(table > self.levels, -(table - (1 << (self.bits - 1))), table)
        values = table[codes.long()].mul_((scale / self.levels).unsqueeze(1))
        return values.view(-1)[:n]

    def _count_elias(self, levels: torch.Tensor, buckets: int) -> None:
        """Bits of the paper's Elias-coded form: per bucket a 32-bit scale; per non-zero level the gamma code of the
        gap since the previous non-zero, one sign bit and the gamma code of the level."""
        flat = levels.view(-1)
        nonzero = flat.nonzero().view(-1)
        gaps = torch.diff(nonzero, prepend=nonzero.new_full((1,), -1))
        bits = 32 * buckets + elias_gamma_bits(gaps) + nonzero.numel() + elias_gamma_bits(flat[nonzero].long())
        self.elias_bits += bits
        self.elements += flat.numel()


class QSGDParams(CompressionParams):
    bits: Literal[2, 4, 8] = 4
    bucket_size: int | None = Field(default=None, ge=1, description="d; default 512 for 4 and 8 bits, 128 for 2")
    norm: Literal["l2", "max"] = "l2"
    report_elias: bool = False

    @model_validator(mode="after")
    def _paper_bucket(self) -> QSGDParams:
        if self.bucket_size is None:
            self.bucket_size = 128 if self.bits == 2 else 512
        return self


class QSGD(CompressedDDP):
    """QSGD data parallel training. On every rank, for every gradient tensor g:
        split g into buckets of d values; per bucket, scale = ||g_b||_2 (or max|g_b|);
        xi = floor(s|g_i|/scale + u), u ~ U[0,1)  (stochastic rounding: unbiased);
        send (sign, xi) bit-packed and the scales; all-gather; g <- mean over ranks of the decoded gradients;
        w <- SGD(w, g).
    No error feedback: the quantizer is unbiased. Variance: E||Q(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2.
    """

    name = "qsgd"
    summary = "QSGD: stochastic s-level quantization per bucket, bit-packed (Alistarh et al. 2017)"
    Params = QSGDParams

    def make_compressor(self) -> Compressor:
        p = self.ctx.params
        return QSGDCompressor(p.bits, p.bucket_size, p.norm, p.report_elias)

    def train_step(self, batch: Batch) -> StepStats:
        stats = super().train_step(batch)
        if self.compressor.report_elias and self.compressor.elements:
            stats.extra["elias_bits_per_element"] = self.compressor.elias_bits / self.compressor.elements
            self.compressor.elias_bits = self.compressor.elements = 0
        return stats


