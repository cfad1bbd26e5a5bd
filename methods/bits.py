"""Bit packing of small unsigned codes into bytes, shared by the compressors and the pipelines' wire codecs."""

from __future__ import annotations

import functools

import torch

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


def byte_codes_bytes(bits: int) -> int:
    """The bytes of byte_codes(bits, device)'s table (256 x 8/bits int64), kept by its cache once made."""
    return 256 * (8 // bits) * torch.empty((), dtype=torch.int64).element_size()


@functools.lru_cache(maxsize=16)
def byte_codes(bits: int, device: torch.device) -> torch.Tensor:
    """The codes packed in each possible byte, little end first: 256 x (8/bits) int64, for table-lookup decoding."""
    return ((torch.arange(256).unsqueeze(1) >> torch.arange(0, 8, bits)) & ((1 << bits) - 1)).to(device)
