"""QSGD (Alistarh et al., NeurIPS 2017): stochastic unbiased quantization of gradients to s levels per bucket."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from harness.data.tensors import Batch
from harness.method import StepStats
from methods.bits import pack_bits_, unpack_bits
from methods.compression.compressed_ddp import CompressedDDP, CompressionParams
from methods.compression.core import Compressed, Compressor


def elias_gamma_bits(values: torch.Tensor) -> int:
    """Total length in bits of the Elias gamma codes of positive integers: 2*floor(log2 x) + 1 each."""
    if values.numel() == 0:
        return 0
    return int((2 * torch.floor(torch.log2(values.double())) + 1).sum().item())


class QSGDCompressor(Compressor):
    """Q_s(v_i) = ||v|| * sgn(v_i) * xi_i / s per bucket of d consecutive values, xi_i = l or l+1 with
    P(l+1) = s|v_i|/||v|| - l, so E[Q_s(v)] = v. s = 2^(bits-1) - 1 levels (1, 7, 127): each value travels as a
    `bits`-wide two's-complement code of its signed level, plus one fp32 scale per bucket.

    Implementation: the signed level is floor(s*v_i/||v|| + u) with u ~ U[0, 1). For r = s*v_i/||v|| this takes
    ceil(r) with probability frac(r) and floor(r) otherwise, which is exactly QSGD's distribution of sgn(v_i)*xi_i
    (for negative r too), with one uniform draw per value and no separate sign pass.
    """

    def __init__(self, bits: int, bucket_size: int, norm: str = "l2", report_elias: bool = False):
        self.bits = bits
        self.levels = (1 << (bits - 1)) - 1
        self.bucket_size = bucket_size
        self.norm = norm
        self.report_elias = report_elias
        self.elias_bits = 0
        self.elements = 0

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(full buckets as rows, the partial last bucket) of a flat tensor, without copying."""
        full = (x.numel() // self.bucket_size) * self.bucket_size
        return x[:full].view(-1, self.bucket_size), x[full:]

    def compress(self, tensor: torch.Tensor, name: str) -> Compressed:
        v = tensor.detach().reshape(-1).float()
        n = v.numel()
        rows, tail = self._split(v)
        if self.norm == "l2":
            scale = torch.cat([rows.norm(dim=1), tail.norm().view(1)] if tail.numel() else [rows.norm(dim=1)])
        else:
            scale = torch.cat([rows.abs().amax(dim=1), tail.abs().amax().view(1)] if tail.numel()
                              else [rows.abs().amax(dim=1)])
        inv = torch.where(scale > 0, self.levels / scale, torch.zeros_like(scale))
        r = torch.empty_like(v)
        r_rows, r_tail = self._split(r)
        torch.mul(rows, inv[:len(rows)].unsqueeze(1), out=r_rows)
        if tail.numel():
            torch.mul(tail, inv[-1], out=r_tail)
        r.add_(torch.rand_like(r)).floor_().clamp_(-self.levels, self.levels)
        levels = r.to(torch.int8)
        if self.report_elias:
            self._count_elias(levels, len(scale))
        codes = levels.view(torch.uint8)
        if self.bits == 8:
            return Compressed([codes, scale], n)
        per = 8 // self.bits
        if n % per:  # whole bytes: the pad codes travel as zeros
            codes = torch.cat([codes, codes.new_zeros(per - n % per)])
        codes.bitwise_and_((1 << self.bits) - 1)
        return Compressed([pack_bits_(codes, self.bits), scale], n)

    def decompress(self, payload: list[torch.Tensor], ctx: Any) -> torch.Tensor:
        packed, scale = payload
        n = ctx
        codes = unpack_bits(packed, self.bits, n)
        if self.bits < 8:  # sign-extend the bits-wide two's complement code
            half = 1 << (self.bits - 1)
            codes = (codes ^ half).view(torch.int8) - half
        values = codes.view(torch.int8).to(torch.float32)
        step = scale / self.levels
        rows, tail = self._split(values)
        rows.mul_(step[:len(rows)].unsqueeze(1))
        if tail.numel():
            tail.mul_(step[-1])
        return values

    def _count_elias(self, levels: torch.Tensor, buckets: int) -> None:
        """Bits of the paper's Elias-coded form: per bucket a 32-bit scale; per non-zero level the gamma code of the
        gap since the previous non-zero, one sign bit and the gamma code of |level|."""
        flat = levels.view(-1)
        nonzero = flat.nonzero().view(-1)
        gaps = torch.diff(nonzero, prepend=nonzero.new_full((1,), -1))
        magnitudes = flat[nonzero].long().abs()
        bits = 32 * buckets + elias_gamma_bits(gaps) + nonzero.numel() + elias_gamma_bits(magnitudes)
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


