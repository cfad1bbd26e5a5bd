"""Test helper for compressors: gradients of awkward shapes and values, and a payload's layout."""

from __future__ import annotations

import torch


def gradient_patterns(n: int) -> dict[str, torch.Tensor]:
    """Tensors of n elements whose values stress a compressor: all zero, normal, 12 decades wide, constant negative."""
    torch.manual_seed(n)
    return {
        "zeros": torch.zeros(n),
        "normal": torch.randn(n),
        "wide range": torch.randn(n) * torch.logspace(-6, 6, n),
        "negative constant": torch.full((n,), -3.0),
    }


def layout(compressed) -> tuple:
    """(dtype, shape) of every payload tensor: what must not depend on the values."""
    return tuple((t.dtype, tuple(t.shape)) for t in compressed.payload)
