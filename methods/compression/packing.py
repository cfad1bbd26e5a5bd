"""Bit packing of small unsigned codes into bytes, per-thread scratch buffers, and the flat buffer a bucket sends."""

from __future__ import annotations

import functools
import threading

import torch

from methods.compression.core import Compressed

# Multiplying a little-endian word of 8/bits one-code bytes by this constant moves code i from bit 8i to bit
# (word bits - 8) + bits*i, without collisions or carries: the word's top byte is then the packed byte.
_WORD_PACK = {1: (torch.int64, 0x0102040810204080, 56), 2: (torch.int32, 0x01041040, 24)}


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned integer codes (< 2**bits, bits in 1, 2, 4, 8) into uint8, 8/bits codes per byte, little end
    first. Returns ceil(n * bits / 8) bytes; `codes` is not modified."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits}")
    flat = codes.reshape(-1)
    if bits == 8:
        return flat.to(torch.uint8, copy=True)
    padded = torch.zeros(round_up(flat.numel(), 8 // bits), dtype=torch.uint8)
    padded[:flat.numel()] = flat
    return pack_bits_(padded, bits)


def pack_bits_(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """pack_bits in place on a uint8 buffer whose length is a multiple of 8/bits (it is overwritten); the fast path
    for compressors that keep their codes in a scratch buffer."""
    if bits in _WORD_PACK:
        dtype, multiplier, shift = _WORD_PACK[bits]
        words = codes.view(dtype)
        words.mul_(multiplier).bitwise_right_shift_(shift).bitwise_and_(0xFF)
        return words.to(torch.uint8)
    words = codes.view(torch.int16)  # bits == 4: a word holds c0 + 256*c1; (w | w >> 4) has c0 | c1 << 4 low
    return words.bitwise_or_(words >> 4).bitwise_and_(0xFF).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of pack_bits: the first `numel` codes, as uint8."""
    if bits == 8:
        return packed[:numel].clone()
    mask = (1 << bits) - 1
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    codes = (packed.unsqueeze(1) >> shifts) & mask
    return codes.flatten()[:numel]


@functools.lru_cache(maxsize=16)
def byte_codes(bits: int, device: torch.device) -> torch.Tensor:
    """The codes packed in each possible byte, little end first: 256 x (8/bits) int64, for table-lookup decoding."""
    return ((torch.arange(256).unsqueeze(1) >> torch.arange(0, 8, bits)) & ((1 << bits) - 1)).to(device)


class Scratch(threading.local):
    """Per-thread buffers reused across calls: on CPU a fresh 100 MB tensor costs more in page faults than a pass of
    arithmetic over it. Per thread, because DDP may decompress one bucket while it compresses the next."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def take(self, key: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buffer = self.buffers.get((key, dtype, device))
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self.buffers[(key, dtype, device)] = buffer
        return buffer[:numel]


def flat_fp32(tensor: torch.Tensor, method: str, name: str) -> torch.Tensor:
    """The gradient as a flat fp32 view; a clear error for other dtypes (codes are computed on fp32 bit patterns)."""
    if tensor.dtype != torch.float32:
        raise TypeError(f"{method}: parameter {name!r} has a {tensor.dtype} gradient; it compresses fp32 gradients, "
                        f"so keep the model in fp32 or send this tensor dense")
    return tensor.detach().reshape(-1)


def to_wire(items: list[Compressed]) -> tuple[torch.Tensor, list[list[tuple[torch.dtype, torch.Size, int]]]]:
    """Concatenate every payload tensor's bytes into one uint8 buffer; returns it and the layout to cut it again."""
    parts: list[torch.Tensor] = []
    layout = []
    for item in items:
        entry = []
        for t in item.payload:
            raw = t.contiguous().view(-1).view(torch.uint8)
            parts.append(raw)
            entry.append((t.dtype, t.shape, raw.numel()))
        layout.append(entry)
    wire = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
    return wire, layout


def from_wire(wire: torch.Tensor, layout: list[list[tuple[torch.dtype, torch.Size, int]]]) -> list[list[torch.Tensor]]:
    """Cut a buffer made by to_wire (on any rank: layouts are equal) back into payload tensors."""
    out, offset = [], 0
    for entry in layout:
        payload = []
        for dtype, shape, nbytes in entry:
            payload.append(wire[offset:offset + nbytes].clone().view(dtype).view(shape))  # clone: aligned storage
            offset += nbytes
        out.append(payload)
    return out
