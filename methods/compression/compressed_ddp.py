"""CompressedDDP: data parallel training whose gradients travel through a compressor and a memory."""

from __future__ import annotations

import abc
from typing import Any

import torch
from pydantic import Field

from harness.comm.communicator import Communicator
from harness.data.tensors import Batch
from harness.memory import state_tensors, tensor_bytes
from harness.method import StepStats
from methods.compression.core import Compressor, Memory
from methods.compression.hook import CompressionHook
from methods.compression.hook_profile import HookProfile, profile_hook, sample_gradients
from methods.compression.retire import ReleasedAfterBackward
from methods.reference.ddp import DDP, DDPParams


class CompressionParams(DDPParams):
    """Parameters every compressed method shares (and ddp's: `microbatches`, gradient accumulation)."""

    min_compress_numel: int = Field(default=0, ge=0, description="tensors with fewer elements are sent dense fp32")


class CompressedDDP(ReleasedAfterBackward, DDP):
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

    def make_memory(self, compressor: Compressor) -> Memory:
        """The memory of this method, for `compressor` (called when the hook is installed, and for its profile)."""
        return Memory()

    def dense_names(self) -> set[str]:
        """Parameters sent as plain fp32: by default those under min_compress_numel elements."""
        return {n for n, p in self.network.named_parameters() if p.numel() < self.ctx.params.min_compress_numel}

    def make_hook(self, comm: Communicator) -> CompressionHook:
        """A hook over a new compressor and memory of this method, communicating through `comm`."""
        names = {p: n for n, p in self.network.named_parameters()}
        compressor = self.make_compressor()
        return CompressionHook(comm, compressor, self.make_memory(compressor), names, self.dense_names())

    def make_profile_hook(self, comm: Communicator) -> CompressionHook:
        """The hook the plan profiles (hook_profile): by default a fresh one as make_hook makes it."""
        return self.make_hook(comm)

    def register_hook(self) -> None:
        self.hook = self.make_hook(self.ctx.comm)
        self.compressor, self.memory = self.hook.compressor, self.hook.memory
        self.retired = self.hook.retired  # released after each backward (ReleasedAfterBackward)
        self.model.register_comm_hook(None, self.hook.__call__)  # DDP wants a function (it logs __name__)
        self._hook_profile: HookProfile | None = None

    def hook_profile(self) -> HookProfile:
        """The hook profiled once, before the first step (methods/compression/hook_profile.py): a fresh compressor
        and memory on one bucket of every gradient, from a forward and backward of this rank's samples."""
        if self._hook_profile is None:
            train, device, loss_fn = self.ctx.workload.train, self.ctx.device, self.ctx.workload.loss
            index = torch.arange(min(len(train), self.local_samples()))
            x, y = train.inputs(index).to(device), train.targets(index).to(device)
            grads = sample_gradients(self.network, lambda: loss_fn(self.network(x), y), device)
            params = [p for p in self.network.parameters() if p.requires_grad]
            self._hook_profile = profile_hook(self.make_profile_hook, self.ctx.rank, self.ctx.world_size, params, grads,
                                              device)
        return self._hook_profile

    def planned_buffer_bytes(self) -> int:
        """DDP's buckets, the memory's state (residuals, DGC's momenta) for the compressed parameters and the
        compressor's scratch buffers (profiled)."""
        dense = self.dense_names()
        compressed = [(n, p) for n, p in self.network.named_parameters() if p.requires_grad and n not in dense]
        return (super().planned_buffer_bytes() + self.memory.planned_bytes(compressed)
                + self.hook_profile().scratch)

    def planned_hook_bytes(self) -> int:
        """The hook's peak on a step after the first, profiled (HookProfile): its payloads, the gathered buffer,
        the decoded rows and the memory's transients. As one bucket of every gradient: DDP's first bucket holds
        1 MiB, which the models of suites/memory-allocator.toml fit; a model of several buckets is planned as if
        their hooks' bytes were alive at once, as they are: each bucket's are kept to the backward's end (retire.py)."""
        return self.hook_profile().peak

    def held_buffer_bytes(self) -> int:
        return (super().held_buffer_bytes() + tensor_bytes(state_tensors(self.memory.state_dict()))
                + self.compressor.scratch_bytes())

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
