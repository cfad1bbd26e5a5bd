"""Data parallel training with DistributedDataParallel; gradients are averaged by an accounted all-reduce hook."""

from __future__ import annotations

from typing import Any

from torch.nn.parallel import DistributedDataParallel

from harness.data import Batch, TensorData
from harness.method import EvalResult, Method, RunContext, StepStats, TrainParams
from harness.training import evaluate_classifier, make_sgd


class DDP(Method):
    """Each of W ranks takes its 1/W shard of the global batch B:
    g_r = grad L(w; B_r); g = (1/W) sum_r g_r (all-reduce, overlapped with backward by DDP); w <- SGD(w, g).
    With equal shards, g is the gradient of the mean loss over B, so ddp follows sgd's trajectory.
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
        self.optimizer = make_sgd(self.model.parameters(), ctx.params)

    def register_hook(self) -> None:
        """Install the communication hook; compression methods override this with their own."""
        self.model.register_comm_hook(None, self.ctx.comm.allreduce_hook)

    @classmethod
    def check_world_size(cls, world_size: int, params: TrainParams) -> str | None:
        if params.batch_size % world_size:
            return f"batch_size {params.batch_size} is not divisible by world_size {world_size}"
        return super().check_world_size(world_size, params)

    def train_step(self, batch: Batch) -> StepStats:
        x, y = batch.shard(self.ctx.rank, self.ctx.world_size)
        x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.ctx.workload.loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return StepStats(loss=loss.item())

    def evaluate(self, test: TensorData) -> EvalResult:
        return evaluate_classifier(self.model.module, test, self.ctx.workload.loss, self.ctx.comm,
                                   self.ctx.params.eval_batch_size, self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
