"""Interleaved 1F1B (Narayanan et al., SC 2021): several stages per rank, a flush per minibatch, a smaller bubble."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from harness.schedule.ir import Schedule
from harness.trace import StepSchedule
from methods.blocks import default_parts
from methods.pipeline.core.placement import Placement
from methods.pipeline.flushed import schedules as schedule
from methods.pipeline.flushed.base import FlushedParams, FlushedPipeline


class InterleavedParams(FlushedParams):
    stages_per_rank: int = Field(default=2, ge=1, description="v: model chunks (stages) each rank holds")


class Interleaved1F1B(FlushedPipeline):
    """The model cut into S = v·p stages; rank r holds stages r, r+p, ..., r+(v-1)p. For each minibatch of M
    microbatches, rank r runs min((v-1)·mpr + 2(p-1-r), v·M) warm-up forwards (mpr = M / max(1, M // p), the
    microbatches of a round), then one forward and one backward in turn, forwards cycling its chunks in rounds of
    mpr microbatches from the first chunk, backwards from the last; then the remaining backwards; then one update per
    stage: the flush. The bubble shrinks from (p-1)/(M+p-1) to (p-1)/(v·M+p-1) at the price of v times the
    messages. The same order as torch.distributed.pipelining's ScheduleInterleaved1F1B (tests compare them)."""

    name = "interleaved-1f1b"
    summary = "interleaved 1F1B: v stages per rank, synchronous, bubble (p-1)/(vM+p-1) (Narayanan et al. 2021)"
    Params: ClassVar[type[InterleavedParams]] = InterleavedParams

    @classmethod
    def ranks_for(cls, world_size: int, params: InterleavedParams) -> int:
        """p: the ranks of the pipeline (simulated ones in the virtual mode: stages / v, default 2)."""
        if world_size > 1:
            return world_size
        return params.stages // params.stages_per_rank if params.stages else default_parts(None, 1)

    @classmethod
    def requested_stages(cls, world_size: int, params: InterleavedParams) -> int:
        return cls.ranks_for(world_size, params) * params.stages_per_rank

    @classmethod
    def stages_field(cls, world_size: int, params: InterleavedParams) -> str:
        if params.stages is not None:
            return "stages"
        return "world_size" if world_size > 1 else "stages_per_rank"

    @classmethod
    def check_placement(cls, world_size: int, params: InterleavedParams) -> str | None:
        """Several stages per rank, in rounds of microbatches, no replicas."""
        v = params.stages_per_rank
        if params.replicas is not None:
            return "interleaved-1f1b does not replicate stages (leave replicas unset)"
        if params.stages is not None and (params.stages % v or (world_size > 1 and params.stages != world_size * v)):
            return (f"stages = {params.stages}: interleaved-1f1b runs stages_per_rank ({v}) stages on each of "
                    f"world_size ranks ({world_size}; any multiple of {v} in the virtual mode)")
        ranks = cls.ranks_for(world_size, params)
        rounds = max(1, params.microbatches // ranks)
        if params.microbatches % rounds:
            return (f"microbatches = {params.microbatches} does not split into equal rounds on {ranks} ranks: make "
                    f"it a multiple of {ranks} (or less than {ranks})")
        if isinstance(params.partition, list) and len(params.partition) != ranks * v - 1:
            return f"partition lists {len(params.partition)} boundaries; {ranks * v} stages need {ranks * v - 1}"
        return None

    def make_placement(self, stages: int, replicas: list[int]) -> Placement:
        return Placement.interleaved(stages // self.ctx.params.stages_per_rank, self.ctx.params.stages_per_rank)

    @classmethod
    def step_schedule(cls, stages: int, microbatches: int) -> StepSchedule:
        """One minibatch on `stages` ranks with the default v stages each (S = v·p model stages, rank r holding r,
        r+p, ...); the next minibatch's microbatches are numbered M on."""
        v = cls.Params.model_fields["stages_per_rank"].default
        return StepSchedule(schedule.interleaved_1f1b(stages, v, microbatches), shift=microbatches, stages=stages * v)

    def rank_schedule(self) -> Schedule:
        p = self.placement.world_size
        return schedule.interleaved_1f1b(p, self.ctx.params.stages_per_rank, self.ctx.params.microbatches)
