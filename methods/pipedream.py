"""PipeDream (Narayanan et al., SOSP 2019): asynchronous 1F1B with weight stashing and a profiler-driven partition."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from torch import nn

from harness.data import Batch
from harness.method import StepStats
from methods.pipeline.executor import Micro
from methods.pipeline.method import PipelineMethod, PipelineParams
from methods.pipeline.schedule import pipedream_delay, pipedream_drain, pipedream_tick
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

    def make_policy(self, stage: int, stages: int, module: nn.Module) -> WeightPolicy:
        return Stashed(module, pipedream_delay(stage, stages), stage, stages, self.ctx.params.vertical_sync)

    def _tick_schedule(self, actions_for) -> list:
        return [actions_for(s) if s in self.stages else [] for s in range(self.S)]

    def train_step(self, batch: Batch) -> StepStats:
        t = batch.step
        self._ticks = t + 1
        micros = self.micros(batch, [batch.indices], [t])
        for micro in micros.values():  # the gradients arriving now belong to earlier minibatches of the same size
            micro.sizes.update({m: len(batch) for m in range(max(0, t - self.S), t)})
        return self.run(self._tick_schedule(lambda s: pipedream_tick(s, self.S, t)), micros, t)

    def end_training(self) -> None:
        ticks = getattr(self, "_ticks", 0)
        size = self.ctx.params.batch_size
        micros = {s: self._drain_micro(ticks, size) for s in self.stages}
        self.run(self._tick_schedule(lambda s: pipedream_drain(s, self.S, ticks)), micros, -1)

    def _drain_micro(self, ticks: int, size: int) -> Micro:
        return Micro(sizes={m: size for m in range(max(0, ticks - self.S), ticks)})
