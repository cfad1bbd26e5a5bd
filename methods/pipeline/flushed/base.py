"""Synchronous pipelines with a flush every minibatch: M microbatches, one update, SGD's gradient (no BatchNorm)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from harness.data.tensors import Batch
from harness.method import RunContext, StepStats
from harness.optim import squared_grad_norm
from harness.schedule.ir import Action, Op, Schedule
from harness.trace import StepSchedule
from methods.pipeline.core.base import PipelineMethod
from methods.pipeline.core.interleaver import validate
from methods.pipeline.core.params import PipelineParams
from methods.pipeline.core.placement import place
from methods.pipeline.core.versions import Live, WeightPolicy


class FlushedParams(PipelineParams):
    microbatches: int = Field(default=4, ge=1, description="microbatches per minibatch (M)")


class ExchangeParams(FlushedParams):
    exchange: Literal["prepost", "fused"] = Field(
        default="prepost", description="how tensors move between stages: 'prepost' (every receive of a step posted "
        "at its start, sends asynchronous: transfers overlap compute) or 'fused' (a receive posted at its action, a "
        "send completed there or together with the receive that follows, as Megatron-LM and torch's Schedule1F1B "
        "pair them: transfers happen while the stage waits); one replica per stage")


class FlushedPipeline(PipelineMethod):
    """Every minibatch is cut into M microbatches (consecutive slices, as torch.tensor_split cuts it), run through the
    schedule, and applied in one update at the end: the flush. The last stage weighs each microbatch's mean loss by
    its share of the minibatch, so the accumulated gradient is the minibatch gradient of single-process SGD
    (transparency). A replicated stage's microbatches go round robin over its replicas, whose gradients are summed
    before the update, so that holds with replication too. Only for models without BatchNorm: with it, each
    microbatch is normalised with its own statistics, and the step's gradient is sum_m |m|/|B| grad L(w; m) with
    microbatch m's statistics (and the running statistics move once per microbatch), not SGD's (docs/methods.md)."""

    Params: ClassVar[type[FlushedParams]] = FlushedParams
    #: The schedule of one minibatch, one list per stage (S, M) -> Schedule; placed on the ranks by `place`.
    make_schedule: ClassVar[Callable[[int, int], Schedule]]

    def make_policy(self, stage: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> WeightPolicy:
        return Live(module)

    def rank_schedule(self) -> Schedule:
        """One minibatch's actions, one list per rank."""
        return place(type(self).make_schedule(self.num_stages, self.ctx.params.microbatches), self.placement)

    clips_globally = True

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.schedule = self.rank_schedule()
        validate(self.schedule, self.placement)
        # With grad_clip the updates wait for the global norm, so they leave the schedule and run after it
        # (clip_and_update); the flush has every stage's gradient complete by then anyway.
        self.updates = [[a for a in actions if a.op is Op.UPDATE] for actions in self.schedule]
        self.schedule_without_updates = [[a for a in actions if a.op is not Op.UPDATE] for actions in self.schedule]

    def microbatch_size(self) -> int:
        return max(1, self.ctx.params.batch_size // self.ctx.params.microbatches)

    def schedule_at(self, step: int) -> Schedule:
        return self.schedule

    def train_step(self, batch: Batch) -> StepStats:
        m = self.ctx.params.microbatches
        sizes = self.microbatch_sizes(len(batch))
        if self.ctx.params.grad_clip is None:
            return self.run(self.schedule, self.views(batch, sizes, list(range(m))), batch.step)
        return self.run(self.schedule_without_updates, self.views(batch, sizes, list(range(m))), batch.step,
                         then=self.clip_and_update)

    def clip_and_update(self) -> dict[int, list[tuple[Action, float, float]]]:
        """grad_clip by the global norm: each stage's sum of squared gradients (its first replica's: replicas hold
        the same synced gradient), summed over the ranks (category `grad_norm`, 8 bytes), then every stage's clipped
        update. The norm is sgd's, up to the order of the sum, so the step is sgd's. -> the UPDATE actions run per
        rank, with their start and end (the norm's reduction counts in the first update's time): the traced step
        has its updates, as an unclipped one has them in its schedule."""
        start = time.perf_counter()
        firsts = {s: self.placement.ranks_of(s)[0] for s in range(self.num_stages)}
        squared = sum((squared_grad_norm(st.module.parameters()) for (r, s), st in self.workers.items()
                       if r == firsts[s]), torch.zeros((), dtype=torch.float64))
        if not self.virtual:
            squared = squared.to(self.ctx.device)  # nccl reduces device tensors only
            self.ctx.comm.all_reduce(squared, "grad_norm")
            squared = squared.cpu()
        ran: dict[int, list[tuple[Action, float, float]]] = {}
        for (rank, stage), st in sorted(self.workers.items()):
            st.update(squared)
            end = time.perf_counter()
            ran.setdefault(rank, []).append((Action(Op.UPDATE, stage), start, end))
            start = end
        return ran

    # A flushed pipeline holds nothing in flight between steps: its state is each stage's weights and optimizer.
    def state_dict(self) -> dict[str, Any]:
        return {"stages": {f"{r}.{s}": {"module": st.module.state_dict(), "optimizer": st.optimizer.state_dict()}
                           for (r, s), st in self.workers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for (r, s), st in self.workers.items():
            st.module.load_state_dict(state["stages"][f"{r}.{s}"]["module"])
            st.optimizer.load_state_dict(state["stages"][f"{r}.{s}"]["optimizer"])


class ExchangedPipeline(FlushedPipeline):
    """A flushed pipeline of one stage per rank (gpipe, 1f1b) whose stage-to-stage exchange is a parameter: with
    `exchange = "fused"` its executor posts each receive at its action and completes each send at its action or
    together with the receive that follows (ProcessExecutor's overlap=False), which is deadlock-free for these
    schedules (every rank's blocking sends are matched in order by its neighbours' receives) but not for interleaved
    or replicated ones, hence not offered there. On a machine whose cores all compute, a transfer that overlaps
    compute takes a core from it: docs/benchmarks.md measures both."""

    Params: ClassVar[type[ExchangeParams]] = ExchangeParams

    @classmethod
    def check_world_size(cls, world_size: int, params: ExchangeParams) -> str | None:
        if params.exchange == "fused" and world_size > 1:
            if params.replicas is not None and params.replicas != [1] * len(params.replicas):
                return f"exchange = 'fused' needs one replica per stage, got replicas = {params.replicas}"
            if params.stages is not None and params.stages != world_size:
                return f"exchange = 'fused' needs one stage per rank, got {params.stages} stages on {world_size} ranks"
        return super().check_world_size(world_size, params)

    @classmethod
    def step_schedule(cls, stages: int, microbatches: int) -> StepSchedule:
        """One minibatch of `make_schedule` (what rank_schedule places, one stage per rank); the next minibatch's
        microbatches are numbered M on."""
        return StepSchedule(cls.make_schedule(stages, microbatches), shift=microbatches)

    def executor_options(self) -> dict[str, Any]:
        return {"overlap": self.ctx.params.exchange == "prepost"}
