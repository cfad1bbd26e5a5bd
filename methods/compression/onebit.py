"""1-bit SGD with error feedback (Seide et al., 2014): each gradient as its sign bits and two means."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from methods.bits import byte_codes, byte_codes_bytes, pack_bits_, round_up
from methods.compression.compressed_ddp import CompressedDDP, CompressionParams
from methods.compression.core import Compressed, Compressor, ErrorFeedback, Memory
from methods.compression.packing import Scratch, flat_fp32


class OneBitCompressor(Compressor):
    """One bit per element, v_k < 0, and two fp32 reconstruction values: the mean of the non-negative entries and
    the mean of the negative entries. Each element decodes to the mean of its side.

    Payload: ceil(n/8) bytes of sign bits in `pack_bits`'s layout (bit 1 = negative), then [mean_nonnegative,
    mean_negative] as two fp32 (8 bytes). A side with no entries gets mean 0 (no element decodes to it).
    """

    sums = False

    def __init__(self) -> None:
        self._scratch = Scratch()

    def scratch_bytes(self) -> int:
        """The scratch buffers, and the decoding's lookup table (byte_codes, cached from its first use on)."""
        return self._scratch.nbytes() + byte_codes_bytes(1)

    def compress(self, tensor: torch.Tensor, name: str) -> Compressed:
        values = flat_fp32(tensor, "onebit", name)
        n = values.numel()
        bits = self._scratch.take("bits", round_up(n, 8), torch.uint8, values.device)
        negative = bits[:n].view(torch.bool)
        torch.lt(values, 0, out=negative)
        bits[n:].zero_()
        count_negative = torch.count_nonzero(negative)
        # Each side's sum directly (not total minus the other side, which cancels when one side is tiny).
        work = self._scratch.take("work", n, torch.float32, values.device)
        sum_negative = torch.clamp(values, max=0, out=work).sum()
        sum_nonnegative = torch.clamp(values, min=0, out=work).sum()
        counts = torch.stack([n - count_negative, count_negative]).clamp_(min=1)
        means = (torch.stack([sum_nonnegative, sum_negative]).double() / counts).to(torch.float32)
        return Compressed([pack_bits_(bits, 1), means], ctx=n)

    def decompress(self, payload: list[torch.Tensor], ctx: Any) -> torch.Tensor:
        """A lookup of each packed byte in a 256 x 8 table of decoded values."""
        packed, means = payload
        table = torch.where(byte_codes(1, packed.device).bool(), means[1], means[0])
        return torch.index_select(table, 0, packed.int()).view(-1)[:ctx]


class OneBitParams(CompressionParams):
    """1-bit SGD's options."""

    min_compress_numel: int = Field(default=256, ge=0,
                                    description="tensors with fewer elements are sent dense fp32 (biases, norms)")


class OneBit(CompressedDDP):
    """1-bit SGD with error feedback. On every worker i, per step, for each parameter tensor's local gradient g,
    with its residual e (0 at the start):

        v      = g + e                                     compensate with what earlier steps did not send
        a+     = mean{v_k : v_k ≥ 0},  a- = mean{v_k : v_k < 0}
        v̂_k    = a+ if v_k ≥ 0 else a-                     1 bit per element (the side) and two fp32
        e      ← v - v̂                                     error feedback: the quantization error is carried
        g      ← (1/W) Σ_i v̂_i  (all-gather of bits and means);   w ← momentum SGD(w, g)

    Reading of "two means": Seide et al. quantize at threshold 0 and reconstruct each side by the mean of the values
    that fell on it (the least-squares choice for that bit); CNTK does this per matrix column, we do it per tensor,
    so a tensor costs 8 bytes of means. Tensors under min_compress_numel elements go dense fp32, without memory.
    """

    name = "onebit"
    family = "data-parallel-compressed"
    summary = "1-bit SGD: sign bits and two means per tensor, with error feedback"
    Params = OneBitParams

    def make_compressor(self) -> Compressor:
        return OneBitCompressor()

    def make_memory(self, compressor: Compressor) -> Memory:
        return ErrorFeedback()
