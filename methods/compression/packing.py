"""Bit packing of small unsigned codes into bytes, and the flat byte buffer one DDP bucket sends."""

from __future__ import annotations

import torch

from methods.compression.core import Compressed


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned integer codes (< 2**bits, bits in 1, 2, 4, 8) into uint8, 8/bits codes per byte, little end
    first. Returns ceil(n * bits / 8) bytes."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits}")
    codes = codes.to(torch.uint8).flatten()
    if bits == 8:
        return codes.clone()
    per = 8 // bits
    pad = (-codes.numel()) % per
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    codes = codes.view(-1, per)
    packed = codes[:, 0].clone()
    for i in range(1, per):
        packed |= codes[:, i] << (i * bits)
    return packed


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of pack_bits: the first `numel` codes, as uint8."""
    if bits == 8:
        return packed[:numel].clone()
    mask = (1 << bits) - 1
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    codes = (packed.unsqueeze(1) >> shifts) & mask
    return codes.flatten()[:numel]


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
