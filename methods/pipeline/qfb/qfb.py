"""Q-FB pipeline (Computing 2022): forward and backward lanes in parallel on shared weights, accumulated updates,
quantized activations and 2-Step GC gradients."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from harness.data.tensors import Batch
from harness.memory import Footprint, LossBlock, MemoryBytes
from harness.method import RunContext, StepStats
from harness.schedule.held import in_flight_peaks
from harness.schedule.ir import FORWARD_LANE_OPS, Schedule
from harness.trace import StepSchedule
from methods.pipeline.core.base import PipelineMethod
from methods.pipeline.core.codecs import Codec, make_codec
from methods.pipeline.core.interleaver import validate
from methods.pipeline.core.memory import StageWalk
from methods.pipeline.core.params import CodecName, PipelineParams
from methods.pipeline.core.placement import place
from methods.pipeline.core.step_bytes import StageTerms, rank_peaks
from methods.pipeline.core.versions import Live, WeightPolicy
from methods.pipeline.qfb.ahead import AheadVersions
from methods.pipeline.qfb.credits import lane_credits, lane_order
from methods.pipeline.qfb.lane_bytes import codec_transient, forward_transients, stage_forward_transient
from methods.pipeline.qfb.lanes import LabelledLanes, LaneExecutor, LaneStage, SingleRankLanes
from methods.pipeline.qfb.piecewise import Piecewise
from methods.pipeline.qfb.schedule import Sync, ahead_lead, qfb_ahead_drain, qfb_ahead_tick, qfb_drain, qfb_tick
from methods.pipeline.qfb.two_step import TwoStep
from methods.pipeline.qfb.weights import OneVersionBehind

#: sync = "ahead": the prototype's buffer in its 3-node Tianhe run (ours/final_result.md, "fbp3": buffer_size 5).
DEFAULT_BUFFER = 5


class QFBParams(PipelineParams):
    microbatches: int = Field(default=4, ge=1, description="microbatches per window (one update per window)")
    lanes: Literal[1, 2] = Field(default=2, description="2: forward and backward lanes run at once (Q-FB); "
                                                        "1: one thread runs both in turn (the ablation)")
    lane_threads: int | None = Field(default=None, ge=1, description="intra-op threads of each lane; default: "
                                                                     "the rank's threads / lanes (at least 1)")
    activation_codec: CodecName = Field(default="int8", description="how activations cross stages (none = fp32)")
    gradient_codec: CodecName | Literal["2step", "piecewise"] = Field(
        default="2step", description="how activation gradients cross stages: '2step' (top-k with error feedback, "
                                     "then int8), 'piecewise' (the prototype's two-segment 8-bit quantizer) or a "
                                     "plain codec")
    density: float = Field(default=0.1, gt=0, le=1, description="2-Step GC: the share of entries kept (step 1)")
    feedback: bool = Field(default=True, description="2-Step GC: carry what was not sent into the next message")
    sync: Sync = Field(default="exact", description="'exact': the next window's forwards wait for the update "
                                                    "(= sgd); 'bounded': they run before it, one version stale; "
                                                    "'ahead': the prototype's reading, forwards run `buffer` "
                                                    "microbatches ahead of the backwards, no flush")
    buffer: int | None = Field(default=None, ge=1, description="sync = 'ahead' only: how many forwards every stage "
                                                               "but the last runs ahead of its backwards (the "
                                                               "prototype's queue; default 5); the last runs 1")

    @model_validator(mode="after")
    def _buffer_is_aheads(self) -> QFBParams:
        if self.buffer is not None and self.sync != "ahead":
            raise ValueError(f"buffer applies to sync = 'ahead' only (sync is {self.sync!r})")
        if self.sync == "ahead" and self.buffer is None:
            self.buffer = DEFAULT_BUFFER  # spec.json records the resolved value
        return self

    @property
    def lead(self) -> int:
        """sync = 'ahead': the forward lane's lead at every stage but the last."""
        return self.buffer or DEFAULT_BUFFER


class QFB(PipelineMethod):
    """The Q-FB pipeline. Only the paper's abstract is public; this is the reading taken (docs/methods.md, Q-FB):

    for each window (runner step) t of M microbatches, at every stage s, at the same time:
        forward lane:  receive activation (int8) -> forward(t, m) -> send activation (int8), m = 0..M-1
        backward lane: receive gradient (2-Step GC) -> backward(t, m) -> send gradient (2-Step GC), m = 0..M-1,
                       the parameter gradients accumulating in .grad; then one update
    Both lanes are threads of the stage's rank with their own intra-op threads and their own process group; they
    share the stage's module (the weights: no copy, no stash) and its autograd graphs. exact: the next window's
    forwards wait for the update, so with codecs off the step equals sgd on the minibatch (BN-free models). bounded:
    the forward lane runs window t while the backward lane finishes window t-1 (OneVersionBehind, one weight copy
    per window). ahead (the prototype's reading, CoderXDY/XdyPipe ours/fbp_work3.py): no flush; each stage's forward
    lane runs `buffer` microbatches ahead of its backward lane (the last stage 1), the update comes after every M
    backwards, and each forward runs on the version its place in the stream fixes (AheadVersions: a gradient is at
    most ceil((buffer - 1) / M) updates stale; buffer 1 = sgd). lanes = 1 runs the same list in one thread (1F1B with
    a flush, when exact). Every part is a switch: lanes, activation_codec, gradient_codec (2step with density and
    feedback, or piecewise), sync, buffer."""

    name = "qfb"
    summary = "Q-FB: forward and backward lanes in parallel on shared weights, int8 activations, 2-Step GC gradients"
    Params: ClassVar[type[QFBParams]] = QFBParams
    stage_class = LaneStage

    @classmethod
    def check_world_size(cls, world_size: int, params: QFBParams) -> str | None:
        if params.replicas is not None and params.replicas != [1] * len(params.replicas):
            return "qfb does not replicate stages (leave replicas unset)"
        return super().check_world_size(world_size, params)

    def make_policy(self, stage: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> WeightPolicy:
        params = self.ctx.params
        if params.sync == "ahead":
            return AheadVersions(module, ahead_lead(stage, stages, params.lead), params.microbatches)
        return Live(module) if params.sync == "exact" else OneVersionBehind(module)

    def make_codec(self, kind: str) -> Codec:
        params = self.ctx.params
        if kind == "grad" and params.gradient_codec == "2step":
            return TwoStep(params.density, params.feedback)
        if kind == "grad" and params.gradient_codec == "piecewise":
            return Piecewise()
        return make_codec(params.activation_codec if kind == "act" else params.gradient_codec)

    def microbatch_size(self) -> int:
        return max(1, self.ctx.params.batch_size // self.ctx.params.microbatches)

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        params = ctx.params
        self.windows = 0  # runner steps taken (windows opened)
        self.wire = self.executor.wire
        if params.sync == "ahead":  # a backward may come up to ceil((lead + M) / M) windows after its forward
            for stage in self.workers.values():
                stage.keep_windows = 2 + -(-params.lead // params.microbatches)
        validate(self.check_run(3), self.placement)
        self.lane_threads = params.lane_threads or max(1, torch.get_num_threads() // params.lanes)
        self.lanes = None
        if params.lanes == 2:
            mine = {s: stage for (_, s), stage in self.workers.items()}
            if self.virtual and self.num_stages > 1:
                self.executor = LabelledLanes(self.executor)
            else:  # one process group per lane, created by every rank in the same order
                comms = [ctx.comm.subgroup(list(range(ctx.world_size))) for _ in range(2)]
                self.lanes = LaneExecutor(ctx.rank, mine, comms, self.placement, self.wire, self.lane_threads)
                self.executor = SingleRankLanes(self.lanes) if self.virtual else self.lanes
                credits = lane_credits(self.planned_steps(one_lane=True))
                for (rank, s), stage in self.workers.items():
                    stage.credits = credits[(rank, s)]

    # -- schedule --------------------------------------------------------------------------------------------------
    @classmethod
    def step_schedule(cls, stages: int, microbatches: int) -> StepSchedule:
        """Window 1 at the default sync ('exact': the window's forwards and backwards in 1F1B order, then the update),
        one list per rank; window 1+k is it with every iteration id plus k (microbatches are numbered per window).
        At the default two lanes, the forward lane's ops (FORWARD_LANE_OPS) run on one thread and the rest on another,
        at once, as LaneExecutor runs them (the projection's simulator runs the two lanes concurrently)."""
        sync = cls.Params.model_fields["sync"].default
        lanes = cls.Params.model_fields["lanes"].default
        return StepSchedule([qfb_tick(s, stages, microbatches, 1, sync) for s in range(stages)], shift=0,
                            iteration_shift=1,
                            forward_lane=tuple(op.value for op in FORWARD_LANE_OPS) if lanes == 2 else ())

    def schedule_at(self, step: int) -> Schedule:
        return self.rank_schedule(step)

    # -- memory: the lanes under their credits ---------------------------------------------------------------------
    def planned_steps(self, one_lane: bool = False) -> list[Schedule]:
        """The first 4S + 4 steps' lists, as the memory plan walks them: where the lanes are threads, each rank's in
        the order its lanes hold the most at once under their credits (credits.py lane_order); else (one lane, or
        the virtual mode's lanes run in one thread, in the list's order) as listed."""
        steps = [self.rank_schedule(t) for t in range(4 * self.num_stages + 4)]
        if one_lane or self.lanes is None:
            return steps
        return lane_order(steps, lane_credits(steps))

    def memory_plan(self) -> dict[int, MemoryBytes]:
        """Per rank, the StepBytes walk of planned_steps (core/step_bytes.py) with each stage's terms."""
        steps = self.planned_steps()
        peaks = in_flight_peaks(steps)
        terms = {(rank, s): self.stage_terms(stage, peaks.get((rank, s), 0))
                 for (rank, s), stage in sorted(self.workers.items())}
        return rank_peaks(steps, terms)

    def threaded_lanes(self) -> bool:
        """Whether the lanes run as two threads at once (LaneExecutor): two lanes on processes, or in a one-stage
        virtual pipeline (a several-stage one runs every list in one thread)."""
        return self.ctx.params.lanes == 2 and (self.ctx.world_size > 1 or getattr(self, "num_stages", 1) == 1)

    def _footprints(self, blocks: list[nn.Module]) -> list[Footprint]:
        prints = super()._footprints(blocks)
        train, device = self.ctx.workload.train, self.ctx.device
        index = torch.arange(min(len(train), max(self.microbatch_sizes())))
        loss = LossBlock(self.ctx.workload.loss, train.targets(index).to(device))
        self._forward_transients = forward_transients(blocks, train.inputs(index).to(device), loss, prints)
        return prints

    def _terms(self, prints: list[Footprint], transients: list[int], module: nn.Module, blocks: tuple[int, int],
               first: bool, last: bool, optimizer: torch.optim.Optimizer, versions: int) -> StageTerms:
        """The core's terms (the stage's first block's backward transient less the input's gradient, which the walk
        holds as the send's grad_input from the backward on), and what Q-FB's wire and lanes add (lane_bytes.py): a
        backward's transient is at least
        its gradient's encoding (2-Step GC's); where the lanes are threads, the forward lane may run its worst action
        beside it, on the next microbatch, which the walk (lane_order) counts as forwarded already: what a forward,
        a decode (before the microbatch's saved tensors and output exist) or an encode holds beyond that adds to
        the backward's (and to the update's, unless exact, where the window's forwards are done by then); 2-Step
        GC's residual (one per message size) is held throughout."""
        p, device, (a, b) = self.ctx.params, self.ctx.device, blocks
        if not first:  # the stage's first block's transient holds the gradient flowing out: the walk's grad_input
            transients = [*transients[:a], max(0, transients[a] - prints[a].input_bytes), *transients[a + 1:]]
        terms = super()._terms(prints, transients, module, blocks, first, last, optimizer, versions)
        into = 0 if first else prints[a].input_bytes // 4  # fp32 elements of the stage's input (and its gradient)
        out = 0 if last else prints[b - 1].output_bytes // 4
        backward = max(terms.backward_temps, codec_transient(lambda: self.make_codec("grad"), into, device))
        update = terms.update_temps
        if self.threaded_lanes():  # the forward lane's next microbatch, which the walk counts as forwarded
            decode = codec_transient(lambda: self.make_codec("act"), into, device, decode=True)
            lane = max(stage_forward_transient(prints, self._forward_transients, a, b, last),
                       decode - terms.saved - terms.output,
                       codec_transient(lambda: self.make_codec("act"), out, device))
            backward += lane
            update += lane if p.sync != "exact" else 0
        sizes = sorted(set(self.microbatch_sizes()))
        residual = 0 if first or p.gradient_codec != "2step" or not p.feedback else \
            sum(prints[a].input_bytes * size // sizes[-1] for size in sizes)
        return replace(terms, backward_temps=backward, update_temps=update, codec_state=residual)

    def stage_walk(self, stages: int) -> StageWalk:
        """The planners' walk of a candidate stage: the default step's lists, with two lanes in their order under
        the credits (as the runner's plan walks them)."""
        step = type(self).step_schedule(max(stages, 1), self.ctx.params.microbatches)
        if self.ctx.params.lanes == 2:
            step = replace(step, ranks=lane_order([step.ranks], lane_credits([step.ranks]))[0])
        return StageWalk(step)

    def rank_schedule(self, window: int) -> Schedule:
        p = self.ctx.params
        if p.sync == "ahead":
            return place([qfb_ahead_tick(s, self.num_stages, p.microbatches, window, p.lead)
                          for s in range(self.num_stages)], self.placement)
        return place([qfb_tick(s, self.num_stages, p.microbatches, window, p.sync) for s in range(self.num_stages)],
                     self.placement)

    def drain_schedule(self, last_window: int) -> Schedule:
        p = self.ctx.params
        if p.sync == "ahead":
            return place([qfb_ahead_drain(s, self.num_stages, p.microbatches, last_window, p.lead)
                          for s in range(self.num_stages)], self.placement)
        return place([qfb_drain(s, self.num_stages, p.microbatches, last_window) for s in range(self.num_stages)],
                     self.placement)

    def check_run(self, windows: int) -> Schedule:
        """A whole run of `windows` steps (and the drain unless exact), one list per rank: what `validate` checks."""
        steps = [self.rank_schedule(t) for t in range(windows)]
        drain = self.drain_schedule(windows - 1) if self.ctx.params.sync != "exact" else [[]] * len(steps[0])
        return [[a for step in steps for a in step[r]] + drain[r] for r in range(self.placement.world_size)]

    def _open_window(self, window: int) -> None:
        for stage in self.workers.values():
            stage.policy.open_window(window)

    # -- steps -----------------------------------------------------------------------------------------------------
    def train_step(self, batch: Batch) -> StepStats:
        p, t = self.ctx.params, batch.step
        sizes = self.microbatch_sizes(len(batch))
        views = self.views(batch, sizes, list(range(p.microbatches)), iteration=t)
        if p.sync != "exact":
            self._open_window(t)
        self.windows = t + 1
        return self.run(self.rank_schedule(t), views, t)

    def end_training(self) -> None:
        """bounded and ahead: run the backwards (and updates) still in flight, so every minibatch of the budget is
        applied."""
        if self.ctx.params.sync == "exact" or self.windows == 0:
            return
        self.drain(self.drain_schedule(self.windows - 1))

    # -- checkpoints (exact only: bounded and ahead have microbatches in flight between steps) ------------------------
    @property
    def checkpointable(self) -> bool:
        return self.ctx.params.sync == "exact"

    def state_dict(self) -> dict[str, Any]:
        wire = self.wire
        return {"stages": {f"{r}.{s}": {"module": st.module.state_dict(), "optimizer": st.optimizer.state_dict()}
                           for (r, s), st in self.workers.items()},
                "activation_codec": wire.activation.state_dict(), "gradient_codec": wire.gradient.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for (r, s), st in self.workers.items():
            st.module.load_state_dict(state["stages"][f"{r}.{s}"]["module"])
            st.optimizer.load_state_dict(state["stages"][f"{r}.{s}"]["optimizer"])
        self.wire.activation.load_state_dict(state["activation_codec"])
        self.wire.gradient.load_state_dict(state["gradient_codec"])

    def finish(self) -> None:
        super().finish()
        if self.lanes is not None:
            self.lanes.close()
