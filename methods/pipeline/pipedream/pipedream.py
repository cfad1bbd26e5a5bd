"""PipeDream (Narayanan et al., SOSP 2019): asynchronous 1F1B with weight stashing, a profiled partition and
replicated stages."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from harness.data.tensors import Batch
from harness.memory import Footprint
from harness.method import RunContext, StepStats
from harness.schedule.ir import Schedule
from harness.trace import StepSchedule
from methods.pipeline.core.base import PipelineMethod
from methods.pipeline.core.params import PipelineParams
from methods.pipeline.core.placement import place
from methods.pipeline.core.step_bytes import StageTerms
from methods.pipeline.core.versions import WeightPolicy
from methods.pipeline.pipedream.memory import first_backward_peak
from methods.pipeline.pipedream.schedule import pipedream_delay, pipedream_drain, pipedream_tick
from methods.pipeline.pipedream.weights import Stashed


class PipeDreamParams(PipelineParams):
    partition: Literal["uniform", "auto"] | list[int] = Field(
        default="auto", description="'auto' (profile each block, then PipeDream's partitioner; with replicas = "
                                    "'auto' it also chooses the stage count and replicas over all ranks), "
                                    "'uniform', or the first block of every stage after the first")
    vertical_sync: bool = Field(default=False, description="every stage uses the version stage 0 used (t - (S-1))")


class PipeDream(PipelineMethod):
    """Asynchronous 1F1B, no flush. A minibatch is the unit (no microbatches). At stage s of S, tick t:

        forward(t)   with the newest weights, which are stashed               (weight stashing)
        if t >= S-1-s:
            backward(t - (S-1-s))   with the weights its forward stashed
            update                  w <- SGD(w, that gradient): the next version

    So the forward and the backward of a minibatch at stage s are S-1-s updates apart, and stage s keeps up to S-s
    versions. With vertical sync the forward of t uses version max(0, t-(S-1)) at every stage. After the last tick,
    the minibatches in flight are completed (the drain), so every minibatch of the budget is applied.

    Replicated stages (1F1B-RR, section 3.2): minibatch t runs on replica t mod r of a stage with r replicas; the r
    replicas update together once per round of r minibatches, with the mean of their gradients (an all-reduce,
    `gradient_sync`), so they always hold the same weights. Such a stage updates every r minibatches instead of every
    one. The split: 'auto' profiles every block on rank 0 (forward and backward time, activation and parameter
    bytes) and solves PipeDream's partitioning DP for one stage per rank or, with `replicas = "auto"`, over all ranks
    with replication (PipeDream's own hybrid plans); `replicas = [2, 1]` sets them by hand.
    """

    name = "pipedream"
    summary = "PipeDream: asynchronous 1F1B pipeline with weight stashing, profiled partition (Narayanan et al. 2019)"
    Params: ClassVar[type[PipeDreamParams]] = PipeDreamParams
    backward_mode = "stashed"
    sync_mean = True
    plans_replication = True
    #: a replica's every backward is the first since its update (one minibatch a tick, or a round of r)
    accumulates_gradients = False

    @classmethod
    def check_world_size(cls, world_size: int, params: PipeDreamParams) -> str | None:
        if params.vertical_sync and (params.replicas == "auto" or isinstance(params.replicas, list)
                                     and any(r > 1 for r in params.replicas)):
            return "vertical_sync assumes one update per minibatch at every stage: give stages without replicas"
        return super().check_world_size(world_size, params)

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.ticks = 0  # minibatches started (ticks run); the drain completes the ones still in flight

    def make_policy(self, stage: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> WeightPolicy:
        return Stashed(module, pipedream_delay(stage, stages), stage, stages, self.ctx.params.vertical_sync)

    def _placed(self, per_stage) -> Schedule:
        return place([per_stage(s, self.placement.replicas(s)) for s in range(self.num_stages)], self.placement)

    def schedule_at(self, step: int) -> Schedule:
        return self.tick_schedule(step)

    def planned_stage_versions(self, after: int, alone: bool, held: int) -> int:
        """A stash per minibatch in flight where an update comes between a forward and its backward."""
        return held if after > 0 else 0

    def _terms(self, prints: list[Footprint], transients: list[int], module: nn.Module, blocks: tuple[int, int],
               first: bool, last: bool, optimizer: torch.optim.Optimizer, versions: int) -> StageTerms:
        """The core's terms, with a backward composed as the first since the update (first_backward_peak) and,
        without vertical sync, each minibatch's stash held from its forward to its backward (`stash`) instead of
        as many stashes as the stage holds minibatches throughout (at the update, the backward's stash is gone)."""
        terms = super()._terms(prints, transients, module, blocks, first, last, optimizer, versions)
        terms = replace(terms, backward_peak=first_backward_peak(prints, transients, [module], blocks, first, last))
        if self.ctx.params.vertical_sync or not versions:
            return terms
        return replace(terms, versions=0, stash=sum(p.numel() * p.element_size() for p in module.parameters()))

    def tick_schedule(self, t: int) -> Schedule:
        """Tick t of every stage, placed on the ranks."""
        return self._placed(lambda s, r: pipedream_tick(s, self.num_stages, t, r))

    @classmethod
    def step_schedule(cls, stages: int, microbatches: int) -> StepSchedule:
        """Tick S-1, the first with a backward at every stage (one stage per rank, no replicas); tick S-1+k is it
        with every minibatch id plus k. `microbatches` is ignored: a minibatch is PipeDream's unit."""
        return StepSchedule([pipedream_tick(s, stages, stages - 1) for s in range(stages)], shift=1)

    def train_step(self, batch: Batch) -> StepStats:
        t = batch.step
        self.ticks = t + 1
        return self.run(self.tick_schedule(t), self.views(batch, [len(batch)], [t]), t)

    def end_training(self) -> None:
        ticks = self.ticks
        self.drain(self._placed(lambda s, r: pipedream_drain(s, self.num_stages, ticks, r)))
