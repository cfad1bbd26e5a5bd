"""Per-thread scratch buffers, fp32 views of gradients, and the flat byte buffer a bucket sends."""

from __future__ import annotations

import threading

import torch

from methods.compression.core import Compressed


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

    def nbytes(self) -> int:
        """Bytes of this thread's buffers."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())


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
