"""Compressor and memory: the two pluggable parts of a compressed all-reduce (after GRACE's decomposition)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.comm.communicator import Communicator


@dataclass
class Compressed:
    """One tensor, compressed. `payload` crosses the wire; `ctx` stays on this rank for decompression.

    A compressor's payload sizes depend only on the input's numel and the compressor's current settings, never on
    the values, so every rank's payload has the same layout and can be all-gathered without a size exchange.
    """

    payload: list[torch.Tensor]
    ctx: Any = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.payload)


class Compressor(abc.ABC):
    """compress(flat fp32 tensor) -> Compressed; decompress(payload, ctx) -> flat fp32 tensor of the same numel."""

    #: True when payloads of different ranks can be summed element-wise (all-reduce); otherwise they are gathered.
    sums: ClassVar[bool] = False

    def prepare(self, named: list[tuple[str, torch.Tensor]], comm: Communicator) -> list[torch.Tensor] | None:
        """Called once per DDP bucket before its tensors are compressed, for collective set-up (TernGrad's shared
        scalers). `named` is [(parameter name, flat local gradient, before memory compensation)] of the tensors
        this compressor will see. Returns the tensors it handed to a collective, which the hook keeps until the
        method lets go of them on the main thread (retire.py: gloo's worker thread may hold them a moment after
        the collective is waited on). Default: nothing."""
        return None

    @abc.abstractmethod
    def compress(self, tensor: torch.Tensor, name: str) -> Compressed: ...

    @abc.abstractmethod
    def decompress(self, payload: list[torch.Tensor], ctx: Any) -> torch.Tensor: ...

    def decompress_add_(self, out: torch.Tensor, payload: list[torch.Tensor], ctx: Any) -> torch.Tensor:
        """out += decompress(payload, ctx), in place. Sparse formats override it to scatter straight into `out`."""
        return out.add_(self.decompress(payload, ctx).view_as(out))

    def scratch_bytes(self) -> int:
        """Bytes this compressor keeps from its first call on: buffers it reuses from call to call (on this thread),
        lookup tables."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class Memory:
    """No memory: compensate returns the gradient as it is, update forgets."""

    def prepare(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Called once per bucket with its (name, gradient) pairs in model order, before their compensate calls:
        a memory that acts on the bucket as a whole (DGC's local clipping by the norm) computes it here."""
        return None

    def compensate(self, tensor: torch.Tensor, name: str, param: torch.Tensor) -> torch.Tensor:
        return tensor

    def update(self, tensor: torch.Tensor, name: str, compressor: Compressor, compressed: Compressed) -> None:
        return None

    def planned_bytes(self, params: list[tuple[str, torch.Tensor]]) -> int:
        """The bytes this memory will hold for these (name, parameter) pairs, planned before the first step."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class ErrorFeedback(Memory):
    """Error feedback (Seide et al. 2014): e <- (g + e) - decompress(compress(g + e)); what was not sent is carried."""

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}

    def compensate(self, tensor: torch.Tensor, name: str, param: torch.Tensor) -> torch.Tensor:
        residual = self.residuals.get(name)
        return tensor if residual is None else tensor + residual

    def update(self, tensor: torch.Tensor, name: str, compressor: Compressor, compressed: Compressed) -> None:
        self.residuals[name] = tensor - compressor.decompress(compressed.payload, compressed.ctx)

    def planned_bytes(self, params: list[tuple[str, torch.Tensor]]) -> int:
        """One fp32 residual per parameter."""
        return sum(4 * p.numel() for _, p in params)

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": dict(self.residuals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals = dict(state["residuals"])
