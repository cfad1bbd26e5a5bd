"""Data parallel training with DistributedDataParallel; gradients are averaged by an accounted all-reduce hook."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import Field, field_validator
from torch.nn.parallel import DistributedDataParallel

from harness.data.tensors import Batch
from harness.memory import gradient_bytes
from harness.method import RunContext, TrainParams
from harness.optim import make_optimizer
from methods.reference.whole_model import WholeModelMethod


class DDPParams(TrainParams):
    """ddp's keys (and those of the compressed ddps, which inherit them)."""

    microbatches: int | Literal["auto"] = Field(
        default=1, description="gradient accumulation: each rank's shard runs as this many microbatches (consecutive "
        "slices), their gradients summed locally under DDP's no_sync and all-reduced once, after the last, so the "
        "step's gradient and bytes on the wire are those of 1; the memory plan holds one microbatch's activations. "
        "'auto': the fewest whose plan fits memory_per_rank (1 without a budget)")

    @field_validator("microbatches", mode="before")
    @classmethod
    def _whole_number_or_auto(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"microbatches must be a whole number of at least 1 or 'auto', got {value!r}")


class DDP(WholeModelMethod):
    """Each of W ranks takes its 1/W shard of the global batch B:
    g_r = grad L(w; B_r); g = (1/W) sum_r g_r (all-reduce, overlapped with backward by DDP); w <- SGD(w, g).
    With equal shards, g is the gradient of the mean loss over B, so ddp follows sgd's trajectory, for models without
    BatchNorm: with it, each rank normalises its shard with the shard's statistics, so g is the mean of per-shard
    gradients, and the running statistics are rank 0's (DDP broadcasts its buffers at every forward).

    With `microbatches = k` (gradient accumulation) each rank's shard B_r is cut into k consecutive slices m_i and
    g_r = sum_i |m_i|/|B_r| grad L(w; m_i), accumulated in .grad under DDP's no_sync for all but the last slice, whose
    backward all-reduces (and compresses, in the compressed ddps) the sum once: the same g, the same bytes on the
    wire, and one slice's activations held at a time.
    """

    name = "ddp"
    family = "data-parallel"
    summary = "DistributedDataParallel with an accounted all-reduce hook (fp32)"
    Params = DDPParams

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self._microbatches: int | None = None  # k, 'auto' resolved on first use (the plan's, or the first step's)
        model = ctx.workload.make_model().to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # DDP's own start-up sync broadcasts the weights as one flat copy, which gloo's worker thread may free where
        # the allocator's meter cannot see it (harness/memory/peak.py): the same sync, one tensor at a time, in place
        self.model = DistributedDataParallel(model, device_ids=device_ids, process_group=ctx.comm.group,
                                             init_sync=False)
        source = dist.get_global_rank(ctx.comm.group, 0) if ctx.comm.group is not None else 0
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                dist.broadcast(tensor, source, group=ctx.comm.group)
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
    def batch_split(cls, world_size: int, params: DDPParams) -> tuple[int, str, str] | None:
        if isinstance(params.microbatches, int) and params.microbatches > 1:
            return (world_size * params.microbatches, "microbatches",
                    f"microbatches ({world_size} data-parallel shards of {params.microbatches} each)")
        return world_size, "batch_size", "data-parallel shards, one per rank"

    def local_batch(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.shard(self.ctx.rank, self.ctx.world_size)

    def local_samples(self) -> int:
        return self.ctx.params.batch_size // self.ctx.world_size

    # -- gradient accumulation -------------------------------------------------------------------------------------

    @property
    def microbatches(self) -> int:
        """k, the microbatches of this rank's shard: the param, or for 'auto' the fewest whose plan fits."""
        if self._microbatches is None:
            self._microbatches = self._fewest_that_fit()
        return self._microbatches

    def activation_samples(self) -> int:
        return -(-self.local_samples() // self.microbatches)  # the largest slice torch.tensor_split cuts

    def _fewest_that_fit(self) -> int:
        """'auto': the fewest k whose plan fits memory_per_rank. A plan need not shrink as k grows (a later
        microbatch's backward adds into gradients that already exist), so every k that cuts the shard into slices of
        a new largest size is planned, in order, until one fits. When none does, the k of the smallest plan, on which
        the runner's gate refuses the run. Logs the choice (kind 'microbatches')."""
        asked, budget, shard = self.ctx.params.microbatches, self.ctx.memory_per_rank, self.local_samples()
        if asked != "auto":
            return asked
        if budget is None:
            return 1

        def planned(k: int) -> int:
            self._microbatches = k
            try:
                return max(plan.total for plan in self.memory_plan().values())
            finally:
                self._microbatches = None

        sizes: dict[int, int] = {}  # the largest slice -> the fewest k that cuts it (torch.tensor_split's sizes)
        for k in range(1, shard + 1):
            sizes.setdefault(-(-shard // k), k)
        plans: dict[int, int] = {}
        for k in sorted(sizes.values()):
            plans[k] = planned(k)
            if plans[k] <= budget:
                break
        fits = [k for k, need in plans.items() if need <= budget]
        chosen = fits[0] if fits else min(plans, key=lambda k: (plans[k], k))
        if self.ctx.rank == 0 and self.ctx.log is not None:
            self.ctx.log("microbatches", asked="auto", chosen=chosen, samples_per_microbatch=-(-shard // chosen),
                         planned_bytes=plans[chosen], memory_per_rank=budget)
        return chosen

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The shard as `microbatches` consecutive slices, each one's mean loss weighted by its share of the shard;
        DDP's no_sync for all but the last, so its hook all-reduces the summed gradient once."""
        k = self.microbatches
        if k == 1:
            return super().forward_backward(x, y)
        total = torch.zeros((), device=x.device)
        for i, (xs, ys) in enumerate(zip(x.tensor_split(k), y.tensor_split(k), strict=True)):
            with self.model.no_sync() if i < k - 1 else contextlib.nullcontext():
                loss = self.ctx.workload.loss(self.model(xs), ys) * (len(xs) / len(x))
                loss.backward()
            total += loss.detach()
        return total

    def planned_buffer_bytes(self) -> int:
        """DDP's gradient buckets: a flat copy of every gradient (gradient_as_bucket_view is off)."""
        return gradient_bytes([self.network])

    def held_buffer_bytes(self) -> int:
        """The buckets' bytes as DDP reports them (its logging data's bucket_sizes)."""
        sizes = str(self.model._get_ddp_logging_data().get("bucket_sizes", ""))
        return sum(int(size) for size in sizes.split(",") if size.strip())
