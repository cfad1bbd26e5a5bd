"""fp16 gradient all-reduce: torch's own fp16_compress_hook, with its bytes counted, as the cheap baseline."""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

from harness.comm.communicator import ring_all_reduce_bytes
from harness.data.tensors import Batch
from harness.method import RunContext, StepStats
from methods.compression.stats import bytes_record
from methods.reference.ddp import DDP


class FP16(DDP):
    """Each bucket is cast to fp16, divided by W, all-reduced (summed), and cast back: half the bytes of fp32.
    The hook is torch's own; dtbench counts its bytes where it hands the bucket over (2 bytes per element)."""

    name = "fp16"
    family = "data-parallel-compressed"
    summary = "fp16 all-reduce (torch's fp16_compress_hook), the cheap baseline"

    def __init__(self, ctx: RunContext):
        self._payload_bytes = 0  # per step, reset by train_step
        self._dense_bytes = 0
        super().__init__(ctx)

    def register_hook(self) -> None:
        self.model.register_comm_hook(self.ctx.comm.group, self._counted_fp16_hook)

    def _counted_fp16_hook(self, process_group, bucket):  # no annotations: DDP checks them literally
        n = bucket.buffer().numel()
        wire = ring_all_reduce_bytes(2 * n, self.ctx.world_size)
        self.ctx.comm.count("gradients", wire, wire)
        self._payload_bytes += 2 * n
        self._dense_bytes += 4 * n
        return fp16_compress_hook(process_group, bucket)

    def planned_hook_bytes(self) -> int:
        """torch's fp16_compress_hook (default_hooks._compress_hook): `buffer.to(float16).div_(W)`, an fp16 copy of
        the bucket (2 bytes an element) alive until its all-reduce is decoded, which copies the sum back into the
        bucket in place. One bucket of every gradient (as CompressedDDP.planned_hook_bytes)."""
        return 2 * sum(p.numel() for p in self.network.parameters() if p.requires_grad)

    def train_step(self, batch: Batch) -> StepStats:
        stats = super().train_step(batch)
        stats.extra.update(bytes_record(self._dense_bytes, self._payload_bytes), collective="all_reduce")
        self._payload_bytes = self._dense_bytes = 0
        return stats
