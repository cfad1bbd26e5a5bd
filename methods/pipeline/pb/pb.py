"""Pipelined Backpropagation with Spike Compensation and Linear Weight Prediction (Kosson et al., MLSys 2021)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, computed_field, model_validator
from torch import nn

from harness.data.tensors import Batch
from harness.memory import LossBlock
from harness.memory.profile import as_they_were
from harness.method import RunContext, StepStats
from harness.schedule.ir import Schedule
from harness.trace import StepSchedule
from methods.pipeline.compensation.prediction import NO_VELOCITY
from methods.pipeline.compensation.spike import SpikeCompensatedSGD
from methods.pipeline.core.base import PipelineMethod
from methods.pipeline.core.executor import Microbatches, Sizes
from methods.pipeline.core.params import PipelineParams
from methods.pipeline.core.placement import place
from methods.pipeline.core.stage import BackwardMode, Stage
from methods.pipeline.core.step_bytes import StageTerms
from methods.pipeline.core.versions import WeightPolicy
from methods.pipeline.pb.memory import StagePass, stage_pass
from methods.pipeline.pb.prediction import Predicted
from methods.pipeline.pb.schedule import pb_delay, pb_tick


def scaled_hyperparameters(lr: float, momentum: float, batch: int, reference_batch: int) -> tuple[float, float]:
    """The paper's scaling rules from a reference batch B to batch b, for undampened momentum:
    keep the momentum half-life in samples, m_b = m_B^(b/B); keep each sample's total contribution to the weights,
    lr_b / (b (1 - m_b)) = lr_B / (B (1 - m_B)), so lr_b = lr_B · b (1 - m_b) / (B (1 - m_B)) (lr_B · b / B without
    momentum). At b = 1: m_1 = m_B^(1/B), lr_1 = lr_B (1 - m_1) / (B (1 - m_B))."""
    m = momentum ** (batch / reference_batch)
    if momentum == 0:
        return lr * batch / reference_batch, 0.0
    return lr * batch * (1 - m) / (reference_batch * (1 - momentum)), m


class PBParams(PipelineParams):
    compensation: Literal["none", "sc"] = Field(
        default="sc", description="sc: spike compensation SC_D at every stage with its delay D_s; none: momentum SGD")
    prediction: Literal["none", "lwp_v", "lwp_w"] = Field(
        default="lwp_v", description="forward on weights predicted D_s updates ahead: lwp_v = w - lr·D·v (default), "
                                     "lwp_w = w + D·(w - w_prev); none: the current weights")
    backward_weights: Literal["current", "stashed"] = Field(
        default="current", description="current: the backward uses the weights current at backward time (PB's weight "
                                       "inconsistency); stashed: the weights its forward used")
    recompute: bool = Field(
        default=False, description="false: the backward differentiates the graph its forward built (the forward's "
        "activations; the paper's PB); true: it recomputes the stage's forward from the stored input with the "
        "current weights (less memory, an extra forward per backward; masks and statistics from the current weights)")
    reference_batch: int | None = Field(
        default=None, ge=1, description="lr and momentum are the values for this batch size; the optimizer applies "
                                        "them scaled to batch_size by the paper's rules (applied_lr, applied_momentum)")

    @model_validator(mode="before")
    @classmethod
    def _earlier_form(cls, data: Any) -> Any:
        """A spec.json written before applied_lr existed recorded the scaled values as lr and momentum, and the
        given ones as reference_lr and reference_momentum: read it as the given ones, so `dtbench rerun` reruns it."""
        if isinstance(data, dict) and {"reference_lr", "reference_momentum"} <= data.keys():
            data = dict(data)  # (one without the other is no such spec.json: its keys stay unknown, an error)
            data["lr"], data["momentum"] = data.pop("reference_lr"), data.pop("reference_momentum")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> PBParams:
        if self.optimizer != "sgd" and (self.compensation == "sc" or self.prediction == "lwp_v"):
            field = "compensation" if self.compensation == "sc" else "prediction"
            raise ValueError(f"optimizer = {self.optimizer!r} with {field} = {getattr(self, field)!r}: spike "
                             "compensation and lwp_v act on momentum SGD's velocity; use optimizer = 'sgd', or "
                             "compensation = 'none' and prediction 'none' or 'lwp_w'")
        if self.recompute and self.backward_weights == "stashed":
            raise ValueError("recompute = true with backward_weights = 'stashed' recomputes what the forward's graph "
                             "already holds, at an extra forward: set recompute = false")
        if self.prediction == "lwp_v" and self.momentum == 0:
            raise ValueError(NO_VELOCITY)
        return self

    @computed_field(description="the lr the optimizer applies: lr scaled from reference_batch to batch_size "
                                "(scaled_hyperparameters), or lr without reference_batch")
    @property
    def applied_lr(self) -> float:
        return self._applied()[0]

    @computed_field(description="the momentum the optimizer applies: momentum^(batch_size / reference_batch), or "
                                "momentum without reference_batch")
    @property
    def applied_momentum(self) -> float:
        return self._applied()[1]

    def _applied(self) -> tuple[float, float]:
        if self.reference_batch is None:
            return self.lr, self.momentum
        return scaled_hyperparameters(self.lr, self.momentum, self.batch_size, self.reference_batch)


class PipelinedBackprop(PipelineMethod):
    """Fine-grained Pipelined Backpropagation: no flush, one update per stage per tick. The runner's step t is tick
    t: sample (batch) t enters stage 0, and at stage s of S:

        forward(sample t - s)                       on the weights predicted D_s updates ahead   (LWP_D)
        backward(sample t - 2(S-1) + s)             with the weights current now (no stash)
        v <- m·v + g;  w <- w - lr·(a·v + b·g)       a = m^D_s, b = (1 - m^D_s)/(1 - m)            (SC_D)

    A sample's forward and backward at stage s are D_s = 2(S-1-s) updates apart (pb_delay; the last stage has none).
    After the last step the pipeline drains: 2(S-1) ticks with no new sample. Each part is switchable
    (`compensation`, `prediction`, `backward_weights`); with one stage it is momentum SGD at the same batch, bitwise.
    With `reference_batch`, lr and momentum are that batch size's, and the optimizer applies them scaled to the
    run's (applied_lr, applied_momentum: scaled_hyperparameters; spec.json records both). Readings of what the
    abstract leaves open are in docs/methods.md.
    """

    name = "pb"
    summary = "Pipelined Backpropagation with Spike Compensation and Linear Weight Prediction (Kosson et al. 2021)"
    Params: ClassVar[type[PBParams]] = PBParams
    accumulates_gradients = False  # one backward per stage per tick, each into the .grad its update let go

    @classmethod
    def steady_from(cls, world_size: int, params: PBParams) -> int:
        """Step 2S-1 (tick 2(S-1)): the first at which every stage runs a backward and holds its steady in-flight
        set (stage s: the 2(S-1-s)+1 samples from t-2(S-1)+s to t; pb_delay). Before it the pipeline is still
        filling and holds less than its plan, which prices the steady state."""
        stages = cls.requested_stages(world_size, params) or 1
        return max(2, pb_delay(0, stages) + 1)

    @classmethod
    def check_world_size(cls, world_size: int, params: PBParams) -> str | None:
        if params.replicas is not None:
            return "pb does not replicate stages (leave replicas unset)"
        if params.nesterov:
            return "pb's spike-compensated momentum is undampened and not Nesterov: set nesterov = false"
        return super().check_world_size(world_size, params)

    def __init__(self, ctx: RunContext):
        self._targets: dict[int, torch.Tensor] = {}  # sample -> labels, kept until the last stage's forward
        self.samples = 0  # samples that entered the pipeline
        super().__init__(ctx)

    @property
    def backward_mode(self) -> BackwardMode:  # type: ignore[override]
        p = self.ctx.params
        if p.backward_weights == "stashed":
            return "graph"
        return "current" if p.recompute else "saved"

    def delay(self, stage: int) -> int:
        return pb_delay(stage, self.num_stages)

    def make_optimizer(self, stage: int, module: nn.Module, delay: int | None = None) -> torch.optim.Optimizer:
        p = self.ctx.params
        if p.optimizer != "sgd":
            return super().make_optimizer(stage, module)
        delay = (self.delay(stage) if delay is None else delay) if p.compensation == "sc" else 0
        return SpikeCompensatedSGD(module.parameters(), lr=p.applied_lr, momentum=p.applied_momentum, delay=delay,
                                   weight_decay=p.weight_decay)

    def plan_optimizer(self, module: nn.Module, after: int) -> torch.optim.Optimizer:
        return self.make_optimizer(0, module, delay=pb_delay(0, after + 1))

    def planned_stage_versions(self, after: int, alone: bool, held: int) -> int:
        """Predicted.planned_versions at a stage of delay 2 `after`."""
        p = self.ctx.params
        return (held if not p.recompute and after > 0 else 0) + (p.prediction == "lwp_w")

    def stage_terms(self, stage: Stage, held: int) -> StageTerms:
        """The core's terms, with what PB keeps per sample walked as it is kept: the weights a forward keeps for its
        backward (a stash, held from the forward to the backward, instead of `held` of them throughout; lwp_w's
        weights before the last update stay throughout); the first stage's sample (its step's batch, which the
        first block saves until the sample's backward 2(S-1) ticks later); the last stage's labels of S samples
        (train_step keeps each from its step until the last stage's forward, S-1 ticks later); lwp_w's copy of the
        weights made at the update beside the last one; and the stage profiled whole with the allocator
        (pb/memory.py stage_pass): its forward's saved tensors as the allocator holds them (a view's whole storage:
        q, k and v of one qkv), its backward's peak (a step's first, as each of PB's is); where the backward
        recomputes, the recomputed forward's bytes under it; a forward's transient, the weights it predicts while
        they are made (Predicted.forward_bytes), then beside its own peak."""
        terms = super().stage_terms(stage, held)
        weights = sum(p.numel() * p.element_size() for p in stage.module.parameters())
        a, _ = self.ranges[stage.index]
        keeps = self.backward_mode == "current" or self._prints[a].saves_input  # recompute keeps the input itself
        batch = self._prints[a].input_bytes if stage.first and keeps else 0
        labels = self.batch_bytes(False, True)
        previous = weights if self.ctx.params.prediction == "lwp_w" else 0  # the new copy beside the last
        terms = replace(terms, versions=stage.policy.planned_versions(0) * weights,
                        stash=weights if stage.policy.needs_stash() else 0, kept_batch=batch,
                        batch=terms.batch + (self.num_stages - 1) * labels * stage.last,
                        update_temps=terms.update_temps + previous)
        profiled = self._stage_pass(stage)
        made = stage.policy.forward_bytes() if isinstance(stage.policy, Predicted) else 0
        own = profiled.no_grad_peak if self.backward_mode == "current" else profiled.forward_peak
        terms = replace(terms, forward_temps=max(made, (weights if made else 0) + own))
        if self.backward_mode == "current":  # the backward recomputes the forward first: its bytes are on top
            recomputed = max(profiled.forward_peak, profiled.kept + profiled.backward_peak)
            return replace(terms, backward_peak=recomputed - terms.output)
        return replace(terms, saved=profiled.kept - terms.output, backward_peak=profiled.backward_peak)

    def _stage_pass(self, stage: Stage) -> StagePass:
        """stage_pass on the profile's sample as `stage` receives it (after the first stage: an activation of its
        shape; the values do not change the bytes), the loss on its labels on the last stage."""
        train, device = self.ctx.workload.train, self.ctx.device
        index = torch.arange(min(len(train), max(self.microbatch_sizes())))
        loss = LossBlock(self.ctx.workload.loss, train.targets(index).to(device)) if stage.last else None
        with as_they_were([], device):  # the activation's draw leaves the RNG as it was
            example = (train.inputs(index).to(device) if stage.first
                       else torch.randn(len(index), *self.shapes[stage.index], device=device))
        return stage_pass(stage.module, example, loss, stage.first)

    def make_policy(self, stage: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> WeightPolicy:
        p = self.ctx.params
        # Without recompute the forward's weights are kept for its backward: the graph saved them (a copy, as the
        # optimizer updates the live ones in place meanwhile), and `saved` mode refills it with the current values.
        return Predicted(module, optimizer, pb_delay(stage, stages), p.prediction, not p.recompute)

    # -- ticks -----------------------------------------------------------------------------------------------------
    @classmethod
    def step_schedule(cls, stages: int, microbatches: int) -> StepSchedule:
        """Tick 2(S-1), the first with a backward at every stage while samples keep entering (the steady state);
        tick 2(S-1)+k is it with every sample id plus k. `microbatches` is ignored: a sample is PB's unit."""
        t = pb_delay(0, stages)
        return StepSchedule([pb_tick(s, stages, t, t + 1) for s in range(stages)], shift=1)

    def schedule_at(self, step: int) -> Schedule:
        """Tick `step`, with step + 1 samples entered (as train_step runs it)."""
        return place([pb_tick(s, self.num_stages, step, step + 1) for s in range(self.num_stages)], self.placement)

    def _views(self, t: int, batch: Batch | None) -> dict[int, Microbatches]:
        """Each local stage's view of tick t: every sample still in flight has the batch size; stage 0 loads sample t,
        the last stage the labels of sample t-(S-1), kept since its step (sizes: the core's rule, executor.Sizes)."""
        last, split = self.num_stages - 1, self.microbatch_sizes()
        local = range(self.num_stages) if self.virtual else self.placement.stages_of(self.ctx.rank)
        views = {s: Microbatches(sizes=Sizes({}, split)) for s in local}
        if 0 in views and batch is not None:
            views[0].inputs[(0, t)] = batch.inputs().to(self.ctx.device)
        done = t - last
        if last in views and done in self._targets:
            views[last].targets[(0, done)] = self._targets.pop(done)
            views[last].scales[(0, done)] = 1.0
        return views

    def train_step(self, batch: Batch) -> StepStats:
        t = batch.step
        self.samples = t + 1
        if self.virtual or self.num_stages - 1 in self.placement.stages_of(self.ctx.rank):
            self._targets[t] = batch.targets().to(self.ctx.device)
        stats = self.run(self.schedule_at(t), self._views(t, batch), t)
        if t < self.num_stages - 1:
            stats.loss = None  # no sample has reached the last stage yet
        return stats

    def end_training(self) -> None:
        """The drain: 2(S-1) ticks without a new sample, so that every sample's backward runs at every stage."""
        for t in range(self.samples, self.samples + 2 * (self.num_stages - 1)):
            self.run(place([pb_tick(s, self.num_stages, t, self.samples) for s in range(self.num_stages)],
                           self.placement), self._views(t, None), -1)
