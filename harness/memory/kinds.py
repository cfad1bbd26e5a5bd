"""A rank's bytes by kind: MemoryBytes (planned before the first step, measured while training) and the kinds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from harness.bytesize import format_bytes

#: Steps whose held bytes a method without per-step records measures (FirstSteps): shapes do not change after the
#: first, and the saved-tensor hooks cost a little on every step they watch.
MEASURED_STEPS = 3


@dataclass
class MemoryBytes:
    """Bytes by kind (KINDS). A plan gives each kind's peak; a measurement each kind's peak over the run, so the
    total is the sum of the kinds' peaks (an upper bound of what was held at any one moment, as PipeDream's planner
    adds weights, stashes and activations)."""

    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    versions: int = 0
    activations: int = 0
    buffers: int = 0
    inputs: int = 0
    temporaries: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, kind) for kind in KINDS)

    def __add__(self, other: MemoryBytes) -> MemoryBytes:
        return MemoryBytes(*(getattr(self, k) + getattr(other, k) for k in KINDS))

    def peak(self, other: MemoryBytes) -> MemoryBytes:
        """Each kind's larger value."""
        return MemoryBytes(*(max(getattr(self, k), getattr(other, k)) for k in KINDS))

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}

    def as_dict_kinds(self) -> dict[str, int]:
        """The kinds alone (no total)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> MemoryBytes:
        return cls(*(int(row.get(k, 0)) for k in KINDS))

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor([getattr(self, k) for k in KINDS], dtype=torch.int64)

    @classmethod
    def from_tensor(cls, row: torch.Tensor) -> MemoryBytes:
        return cls(*(int(v) for v in row.tolist()))

    def describe(self) -> str:
        """The non-zero kinds, largest first: 'weights 3.2 MB, activations 1.1 MB'."""
        parts = sorted((k for k in KINDS if getattr(self, k)), key=lambda k: -getattr(self, k))  # stable: KINDS order
        return ", ".join(f"{k} {format_bytes(getattr(self, k))}" for k in parts)


#: What a rank holds, by kind. weights: parameters and buffers; gradients: the parameters' .grad; optimizer: its
#: state (momentum, Adam's moments and steps); versions: weight versions kept besides the live ones (stashes,
#: predictions, double buffers); activations: what autograd keeps for backwards still to run, at their peak;
#: buffers: communication and compression state (DDP's gradient buckets, error-feedback residuals, DGC's momenta,
#: PowerSGD's error and factors, a compressor's reused scratch); inputs: the step's batch (x, y) as the rank holds
#: it through the step; temporaries: what the rank's peak holds beyond the other kinds, the largest phase of a step
#: (harness/memory/step.py: backward's transients, the optimizer's and clipping's, a hook's payloads) over the
#: gradients and activations already counted. Measured (held), temporaries stay 0: the allocator's peak is their
#: ground truth.
KINDS = tuple(f.name for f in fields(MemoryBytes))
