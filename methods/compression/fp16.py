"""fp16 gradient all-reduce, the cheap baseline: torch's fp16_compress_hook, step for step, with its bytes counted."""

from __future__ import annotations

import torch

from harness.data.tensors import Batch
from harness.method import RunContext, StepStats
from methods.compression.retire import ReleasedAfterBackward, Retired
from methods.compression.stats import bytes_record
from methods.reference.ddp import DDP


class FP16(ReleasedAfterBackward, DDP):
    """Each bucket is cast to fp16, divided by W, all-reduced (summed), and cast back into the bucket in place: half
    the bytes of fp32. The hook is torch's fp16_compress_hook (torch/distributed/algorithms/ddp_comm_hooks/
    default_hooks.py, _compress_hook with dtype float16: `buffer.to(float16).div_(W)`, all-reduced, then
    `buffer.copy_(sum)`), written here so that its fp16 copy is let go of on the main thread after the backward
    (methods/compression/retire.py), not on gloo's thread where torch's closure drops it; the all-reduce goes
    through the Communicator, which counts its bytes (2 per element)."""

    name = "fp16"
    family = "data-parallel-compressed"
    summary = "fp16 all-reduce (torch's fp16_compress_hook), the cheap baseline"

    def __init__(self, ctx: RunContext):
        self._payload_bytes = 0  # per step, reset by train_step
        self._dense_bytes = 0
        self.retired = Retired()
        super().__init__(ctx)

    def register_hook(self) -> None:
        self.model.register_comm_hook(None, self._fp16_hook)

    def _fp16_hook(self, _state, bucket):  # no annotations: DDP checks them literally
        buffer = bucket.buffer()
        compressed = buffer.to(torch.float16).div_(self.ctx.world_size)
        self._payload_bytes += 2 * buffer.numel()
        self._dense_bytes += 4 * buffer.numel()
        fut = self.ctx.comm.all_reduce(compressed, "gradients", async_op=True)
        self.retired.bag(compressed=compressed)  # the callback reads the sum from its future, not its closure
        self.retired.sent(compressed)
        del compressed

        def decompress(f):
            buffer.copy_(f.value())  # in place, to keep the peak down (torch's note: pytorch issue 45968)
            return buffer

        return fut.then(decompress)

    def planned_hook_bytes(self) -> int:
        """The fp16 copy of the bucket (2 bytes an element), from the hook until the backward's end, when the
        method lets go of it (its sum is copied back into the bucket in place). One bucket of every gradient (as
        CompressedDDP.planned_hook_bytes); with several buckets, every bucket's copy lives to the backward's end."""
        return 2 * sum(p.numel() for p in self.network.parameters() if p.requires_grad)

    def train_step(self, batch: Batch) -> StepStats:
        stats = super().train_step(batch)
        stats.extra.update(bytes_record(self._dense_bytes, self._payload_bytes), collective="all_reduce")
        self._payload_bytes = self._dense_bytes = 0
        return stats
