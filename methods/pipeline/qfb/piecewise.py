"""The prototype's two-segment 8-bit quantizer, an alternative reading of Q-FB's "2-Step" gradient compression."""

from __future__ import annotations

import math
from typing import Any

import torch

from methods.bits import pack_bits, unpack_bits
from methods.pipeline.core.codecs import Codec

HEADER_BYTES = 8  # the message's max |x| and threshold, fp32 each
LOW_CODES = 2.0**6  # codes [0, 64] cover [0, threshold]
TOP_CODE = 2.0**8 - 1  # codes [64, 255] cover [threshold, max |x|]


class Piecewise(Codec):
    """Two linear segments of magnitude codes, the shape of the `piecewise_quantize` function in the public
    repository CoderXDY/XdyPipe (folder ours/, which looks like Q-FB's prototype; our code, its formulas):

    with v = max |x| and the threshold τ = share · v (the prototype's share: 0.1), a magnitude a = |x| gets the code
        c = round(a · 64 / τ)                          if a < τ   (the small values, 64 steps of τ/64)
        c = round(255 - (v - a) · (255 - 64) / (v - τ)) if a ≥ τ   (the large values, 191 steps)
    and the receiver inverts the segment the code falls in (c < 64: the first). Both segments map τ to 64, so the
    segments meet. The sign travels apart. Nothing is dropped and nothing is carried over (no error feedback), so
    a message's error is at most half a step of its segment: max(τ/128, (v - τ)/382).

    Payload of n elements: [v: fp32][τ: fp32][signs: ceil(n/8) bytes, one bit each][codes: n bytes, uint8]."""

    name = "piecewise"

    def __init__(self, share: float = 0.1):
        if not 0.0 < share < 1.0:
            raise ValueError(f"the piecewise quantizer's threshold share must be in (0, 1), got {share}")
        self.share = share

    def nbytes(self, numel: int) -> int:
        return HEADER_BYTES + math.ceil(numel / 8) + numel

    def encode(self, tensor: torch.Tensor, stream: Any = None) -> torch.Tensor:
        x = tensor.detach().float().reshape(-1)
        magnitude = x.abs()
        top = magnitude.max() if x.numel() else torch.zeros(())
        threshold = top * self.share
        codes = torch.zeros_like(magnitude)
        if top > 0:
            low = magnitude < threshold
            codes[low] = magnitude[low] * (LOW_CODES / threshold)
            codes[~low] = TOP_CODE - (top - magnitude[~low]) * ((TOP_CODE - LOW_CODES) / (top - threshold))
            codes = codes.round_().clamp_(0, TOP_CODE)
        header = torch.stack([top, threshold]).float().view(torch.uint8)
        return torch.cat([header, pack_bits((x < 0).to(torch.uint8), 1), codes.to(torch.uint8)])

    def decode(self, payload: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        n = math.prod(shape)
        top, threshold = payload[:HEADER_BYTES].clone().view(torch.float32)
        signs = unpack_bits(payload[HEADER_BYTES:HEADER_BYTES + math.ceil(n / 8)], 1, n)
        codes = payload[HEADER_BYTES + math.ceil(n / 8):].float()
        magnitude = torch.zeros(n)
        if top > 0:
            low = codes < LOW_CODES
            magnitude[low] = codes[low] * (threshold / LOW_CODES)
            magnitude[~low] = top - (TOP_CODE - codes[~low]) * ((top - threshold) / (TOP_CODE - LOW_CODES))
        return torch.where(signs.bool(), -magnitude, magnitude).view(shape)

    def error_bound(self, tensor: torch.Tensor) -> float:
        if tensor.numel() == 0:
            return 0.0
        top = float(tensor.abs().max())
        threshold = top * self.share
        return max(threshold / (2 * LOW_CODES), (top - threshold) / (2 * (TOP_CODE - LOW_CODES))) + 1e-6 * top
