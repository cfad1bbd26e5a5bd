"""Data parallel training with DistributedDataParallel; gradients are averaged by an accounted all-reduce hook."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from harness.data.tensors import Batch
from harness.memory import gradient_bytes
from harness.method import RunContext, TrainParams
from harness.optim import make_optimizer
from methods.reference.whole_model import WholeModelMethod


class DDP(WholeModelMethod):
    """Each of W ranks takes its 1/W shard of the global batch B:
    g_r = grad L(w; B_r); g = (1/W) sum_r g_r (all-reduce, overlapped with backward by DDP); w <- SGD(w, g).
    With equal shards, g is the gradient of the mean loss over B, so ddp follows sgd's trajectory, for models without
    BatchNorm: with it, each rank normalises its shard with the shard's statistics, so g is the mean of per-shard
    gradients, and the running statistics are rank 0's (DDP broadcasts its buffers at every forward).
    """

    name = "ddp"
    family = "data-parallel"
    summary = "DistributedDataParallel with an accounted all-reduce hook (fp32)"

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        model = ctx.workload.make_model().to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids, process_group=ctx.comm.group)
        self.register_hook()
        self.optimizer = make_optimizer(self.model.parameters(), ctx.params)

    def register_hook(self) -> None:
        """Install the communication hook; compression methods override this with their own."""
        self.model.register_comm_hook(None, self.ctx.comm.allreduce_hook)

    @classmethod
    def check_world_size(cls, world_size: int, params: TrainParams) -> str | None:
        if params.batch_size % world_size:
            return f"batch_size {params.batch_size} is not divisible by world_size {world_size}"
        return super().check_world_size(world_size, params)

    @classmethod
    def batch_split(cls, world_size: int, params: TrainParams) -> tuple[int, str, str] | None:
        return world_size, "batch_size", "data-parallel shards, one per rank"

    def local_batch(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.shard(self.ctx.rank, self.ctx.world_size)

    def local_samples(self) -> int:
        return self.ctx.params.batch_size // self.ctx.world_size

    def planned_buffer_bytes(self) -> int:
        """DDP's gradient buckets: a flat copy of every gradient (gradient_as_bucket_view is off)."""
        return gradient_bytes([self.network])

    def held_buffer_bytes(self) -> int:
        """The buckets' bytes as DDP reports them (its logging data's bucket_sizes)."""
        sizes = str(self.model._get_ddp_logging_data().get("bucket_sizes", ""))
        return sum(int(size) for size in sizes.split(",") if size.strip())
