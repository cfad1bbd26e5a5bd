"""PipeDream (Narayanan et al., SOSP 2019): asynchronous 1F1B with weight stashing and a profiler-driven partition."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

from pydantic import Field
from torch import nn

from harness.data.tensors import Batch
from harness.method import RunContext, StepStats
from methods.pipeline.executor import Microbatches
from methods.pipeline.method import PipelineMethod, PipelineParams
from methods.pipeline.schedule import Action, Schedule, pipedream_delay, pipedream_drain, pipedream_tick
from methods.pipeline.versions import Stashed, WeightPolicy


class PipeDreamParams(PipelineParams):
    partition: Literal["uniform", "auto"] | list[int] = Field(
        default="auto", description="'auto' (profile each block, then PipeDream's partitioner), 'uniform', or the "
                                    "first block of every stage after the first")
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

    The split: 'auto' profiles every block on rank 0 (forward and backward time, activation and parameter bytes) and
    solves PipeDream's partitioning DP for S stages without replication (the executor runs one rank per stage); the
    DP's best plan with replication over the same workers is written next to it in partition.json, with the measured
    stage times at the end of the run.
    """

    name = "pipedream"
    summary = "PipeDream: asynchronous 1F1B pipeline with weight stashing, profiled partition (Narayanan et al. 2019)"
    Params: ClassVar[type[PipeDreamParams]] = PipeDreamParams

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.ticks = 0  # minibatches started (ticks run); the drain completes the ones still in flight

    def make_policy(self, stage: int, stages: int, module: nn.Module) -> WeightPolicy:
        return Stashed(module, pipedream_delay(stage, stages), stage, stages, self.ctx.params.vertical_sync)

    def _tick_schedule(self, actions_for: Callable[[int], list[Action]]) -> Schedule:
        return [actions_for(s) if s in self.stages else [] for s in range(self.num_stages)]

    def train_step(self, batch: Batch) -> StepStats:
        t = batch.step
        self.ticks = t + 1
        views = self.microbatches(batch, [batch.indices], [t])
        for view in views.values():  # the gradients arriving now belong to earlier minibatches of the same size
            view.sizes.update({m: len(batch) for m in range(max(0, t - self.num_stages), t)})
        return self.run(self._tick_schedule(lambda s: pipedream_tick(s, self.num_stages, t)), views, t)

    def end_training(self) -> None:
        ticks, size = self.ticks, self.ctx.params.batch_size
        views = {s: Microbatches(sizes={m: size for m in range(max(0, ticks - self.num_stages), ticks)})
                 for s in self.stages}
        self.run(self._tick_schedule(lambda s: pipedream_drain(s, self.num_stages, ticks)), views, -1)
