"""CompressedDDP: data parallel training whose gradients travel through a compressor and a memory."""

from __future__ import annotations

import abc
from typing import Any

from pydantic import Field

from harness.data.tensors import Batch
from harness.memory import state_tensors, tensor_bytes
from harness.method import StepStats
from methods.compression.core import Compressor, Memory
from methods.compression.hook import CompressionHook
from methods.reference.ddp import DDP, DDPParams


class CompressionParams(DDPParams):
    """Parameters every compressed method shares (and ddp's: `microbatches`, gradient accumulation)."""

    min_compress_numel: int = Field(default=0, ge=0, description="tensors with fewer elements are sent dense fp32")


class CompressedDDP(DDP):
    """DDP with a CompressionHook. Subclasses say which compressor and memory; the rest is shared.

    Train records gain, per step and rank: compress_s, communicate_s, decompress_s, dense_bytes, payload_bytes and
    compression_ratio (dense fp32 bytes / bytes handed to the collective), and collective (all_reduce when the
    payloads sum, else all_gather: what a projection to other world sizes needs).
    """

    family = "data-parallel-compressed"
    Params = CompressionParams

    @abc.abstractmethod
    def make_compressor(self) -> Compressor:
        """The compressor of this method (called once, when the hook is installed)."""

    def make_memory(self) -> Memory:
        return Memory()

    def dense_names(self) -> set[str]:
        """Parameters sent as plain fp32: by default those under min_compress_numel elements."""
        return {n for n, p in self.network.named_parameters() if p.numel() < self.ctx.params.min_compress_numel}

    def register_hook(self) -> None:
        names = {p: n for n, p in self.network.named_parameters()}
        self.compressor = self.make_compressor()
        self.memory = self.make_memory()
        self.hook = CompressionHook(self.ctx.comm, self.compressor, self.memory, names, self.dense_names())
        self.model.register_comm_hook(None, self.hook.__call__)  # DDP wants a function (it logs __name__)

    def planned_buffer_bytes(self) -> int:
        """DDP's buckets and the memory's state (residuals, DGC's momenta) for the compressed parameters."""
        dense = self.dense_names()
        compressed = [(n, p) for n, p in self.network.named_parameters() if p.requires_grad and n not in dense]
        return super().planned_buffer_bytes() + self.memory.planned_bytes(compressed)

    def held_buffer_bytes(self) -> int:
        return super().held_buffer_bytes() + tensor_bytes(state_tensors(self.memory.state_dict()))

    def train_step(self, batch: Batch) -> StepStats:
        stats = super().train_step(batch)
        stats.extra.update(self.hook.stats.pop())
        stats.extra["collective"] = "all_reduce" if self.compressor.sums else "all_gather"
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "compressor": self.compressor.state_dict(),
                "memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.compressor.load_state_dict(state["compressor"])
        self.memory.load_state_dict(state["memory"])
