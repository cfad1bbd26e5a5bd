"""PipelineMethod, the template every pipeline follows: plan and placement, this rank's stages, an executor, running a
schedule (and the drain), and evaluation through the pipeline; its parameters, views and records live beside it."""

from __future__ import annotations

import abc
from collections.abc import Callable
from copy import deepcopy as copy_module
from typing import Any, ClassVar

import torch
from torch import nn

from harness.data.tensors import Batch, TensorData
from harness.memory import Footprint, LossBlock, MemoryBytes, footprints
from harness.memory.step import batch_bytes
from harness.method import EvalResult, Method, RunContext, StepStats
from harness.optim import make_optimizer
from harness.schedule.held import in_flight_peaks
from harness.schedule.ir import Action, Schedule
from harness.trace_export import write_chrome_trace
from methods.blocks import SUMS_WIDTH, classifier_sums, default_parts, eval_mode, evaluate_chain, output_shapes, too_few
from methods.pipeline.core import plan_memory, planning
from methods.pipeline.core.codecs import Codec, make_codec
from methods.pipeline.core.executor import Microbatches, ProcessExecutor, VirtualExecutor, Wire
from methods.pipeline.core.memory import StageWalk, backward_transients, held_bytes, split_retained, stage_terms
from methods.pipeline.core.params import PipelineParams
from methods.pipeline.core.placement import Placement, replica_comms
from methods.pipeline.core.records import StageClock, memory_peaks, step_extra
from methods.pipeline.core.stage import BackwardMode, Stage
from methods.pipeline.core.step_bytes import StageTerms, rank_peaks
from methods.pipeline.core.versions import WeightPolicy
from methods.pipeline.core.views import split_sizes, stage_views


class PipelineMethod(Method):
    """Blocks split into S contiguous stages placed on ranks (one each, replicated, or several per rank), or every rank
    simulated in this process (world size 1: the virtual mode, same schedule and numerics). Subclasses give the
    schedule and the weight-version policy, and may change the optimizer, the backward mode and the codecs."""

    family = "pipeline"
    Params: ClassVar[type[PipelineParams]] = PipelineParams
    backward_mode: ClassVar[BackwardMode] = "graph"
    #: Whether the schedule splits backwards into B and W (zero-bubble): a B keeps its graph for the W.
    backward_split: ClassVar[bool] = False
    _retained: list[int] | None = None  # a split B's kept bytes per block (split_retained), profiled with the prints
    #: Replicas' gradients at a sync: summed (a flushed pipeline's loss scales already weigh each microbatch) or
    #: averaged over the minibatches they ran (an asynchronous pipeline whose every minibatch has scale 1).
    sync_mean: ClassVar[bool] = False
    #: Whether `replicas = "auto"` may let PipeDream's DP choose stages and replicas (methods that replicate).
    plans_replication: ClassVar[bool] = False
    #: The class of each stage (a subclass may run a stage's forwards and backwards on two threads: qfb's lanes).
    stage_class: ClassVar[type[Stage]] = Stage
    #: How grad_clip is applied. False: each stage clips its own gradient at its update (an asynchronous pipeline's
    #: stages update at different times, on gradients of different minibatches, so there is no global norm to
    #: wait for). True: the method clips by the norm over all stages itself (a flushed pipeline: clip_and_update).
    clips_globally: ClassVar[bool] = False
    #: False where a stage's every backward is the first since its update (PB): none adds into an existing .grad.
    accumulates_gradients: ClassVar[bool] = True

    # -- what the suite may ask for ------------------------------------------------------------------------------------
    @classmethod
    def requested_stages(cls, world_size: int, params: PipelineParams) -> int | None:
        """The stage count known before the plan (None: the partitioner chooses it at run time)."""
        if isinstance(params.replicas, list):
            return len(params.replicas)
        if params.replicas == "auto":
            return None
        return default_parts(params.stages, world_size)

    @classmethod
    def check_world_size(cls, world_size: int, params: PipelineParams) -> str | None:
        """Microbatches no more than the batch, then the placement's rule, then the contract's."""
        microbatches = getattr(params, "microbatches", None)
        if microbatches is not None and microbatches > params.batch_size:
            return f"microbatches = {microbatches} exceeds batch_size = {params.batch_size}"
        return cls.check_placement(world_size, params) or super().check_world_size(world_size, params)

    @classmethod
    def batch_split(cls, world_size: int, params: PipelineParams) -> tuple[int, str, str] | None:
        """A step's batch is cut into `microbatches` (pipelines without the parameter take it whole)."""
        microbatches = getattr(params, "microbatches", None)
        return None if microbatches is None else (microbatches, "microbatches", "microbatches")

    @classmethod
    def check_placement(cls, world_size: int, params: PipelineParams) -> str | None:
        """The placement's rule: one stage per rank, or replicas summing to the world size (world size 1: the
        virtual mode), and a boundary per stage. A method that places stages otherwise (interleaved: several per
        rank; APapo's antichain plan) relaxes it by overriding this."""
        stages = cls.requested_stages(world_size, params)
        if params.replicas == "auto":
            if not cls.plans_replication:
                return f"method {cls.name!r} does not plan replication: give replicas as a list, e.g. [2, 1]"
            if params.partition != "auto" or world_size < 2:
                return "replicas = 'auto' lets the partitioner plan over the ranks: it needs partition = 'auto' " \
                       "and world_size >= 2"
        elif isinstance(params.replicas, list):
            if params.stages is not None and params.stages != len(params.replicas):
                return f"stages = {params.stages} but replicas lists {len(params.replicas)} stages"
            if world_size not in (1, sum(params.replicas)):
                return (f"replicas {params.replicas} need {sum(params.replicas)} ranks (or world_size 1 for the "
                        f"virtual mode), got world_size {world_size}")
        elif world_size > 1 and stages != world_size:
            return (f"stages = {stages} but world_size = {world_size}: one stage per rank, replicas = [...] "
                    f"summing to the world size, or world_size 1 for the virtual mode")
        if isinstance(params.partition, list) and stages is not None and len(params.partition) != stages - 1:
            return f"partition lists {len(params.partition)} boundaries; {stages} stages need {stages - 1}"
        return None

    @classmethod
    def stages_field(cls, world_size: int, params: PipelineParams) -> str:
        """The field the stage count of requested_stages comes from, for messages."""
        if isinstance(params.replicas, list):
            return "replicas"
        return "stages" if params.stages is not None or world_size == 1 else "world_size"

    @classmethod
    def check_model(cls, world_size: int, params: PipelineParams, model: Callable[[], nn.Sequential]
                    ) -> tuple[str, str] | None:
        """Every stage needs a block: the stage count asked for must not exceed the model's blocks, nor may a
        partition boundary lie past its last block."""
        blocks = len(model())
        stages = cls.requested_stages(world_size, params)
        if stages is not None and stages > blocks:
            return cls.stages_field(world_size, params), too_few(stages, "stages", blocks)
        if isinstance(params.partition, list) and params.partition[-1] >= blocks:
            return "partition", f"partition {params.partition}: the workload's model has blocks 0..{blocks - 1}"
        return None

    # -- hooks -----------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def make_policy(self, stage: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> WeightPolicy:
        """The weight-version policy of stage `stage` of `stages`, over its module (and its optimizer's state)."""

    def make_optimizer(self, stage: int, module: nn.Module) -> torch.optim.Optimizer:
        """The optimizer of one stage (default: SGD with the run's lr, momentum, weight decay, Nesterov)."""
        return make_optimizer(module.parameters(), self.ctx.params)

    def make_codec(self, kind: str) -> Codec:
        """The codec of activations ('act') or activation gradients ('grad') on the wire."""
        return make_codec(self.ctx.params.activation_codec if kind == "act" else self.ctx.params.gradient_codec)

    def make_placement(self, stages: int, replicas: list[int]) -> Placement:
        """Where stages run: replicated (or one per rank) by default; interleaved schedules override it."""
        return Placement.replicated(replicas)

    def microbatch_size(self) -> int:
        """Samples per microbatch, for the profiler."""
        return self.ctx.params.batch_size

    def make_blocks(self, example: torch.Tensor) -> list[nn.Module]:
        """The blocks the plan cuts into stages (default: the workload's model's blocks; `example` is a microbatch of
        training inputs on the run's device)."""
        return list(self.ctx.workload.make_model().to(self.ctx.device))

    def make_plan(self, blocks: list[nn.Module], example: torch.Tensor, stages: int | None) -> planning.Plan:
        """Each stage's block range and replicas, the same on every rank (collective): the partition and replicas
        the suite asked for (planning.make_plan)."""
        params = self.ctx.params
        auto = params.replicas == "auto"
        replicas = params.replicas if isinstance(params.replicas, list) else None
        walk = self.stage_walk(min(len(blocks), max(self.ctx.world_size, stages or 1)))
        memory = walk and plan_memory.ChainMemory(walk, lambda a, b, after, held: self.planned_terms(
            self._prints, self._transients, nn.Sequential(*blocks[a:b]), (a, b), a == 0, after, held))
        return planning.make_plan(blocks, example, params.partition, params.stages if auto else stages,
                                  replicas or (None if auto else [1] * stages), self.ctx.world_size,
                                  params.bandwidth, self.ctx.comm, auto_replicas=auto, memory=memory,
                                  budget=self.ctx.memory_per_rank)

    def executor_options(self) -> dict[str, Any]:
        """Extra keyword arguments of this rank's ProcessExecutor (e.g. overlap; default none)."""
        return {}

    # -- set-up ----------------------------------------------------------------------------------------------------
    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        params = ctx.params
        example = ctx.workload.train.inputs(torch.arange(min(len(ctx.workload.train), self.microbatch_size())))
        blocks = self.make_blocks(example.to(ctx.device))
        stages = self.requested_stages(ctx.world_size, params)
        if stages is not None and len(blocks) < stages:
            raise ValueError(f"the workload's model has {len(blocks)} blocks: too few for {stages} stages")
        self._prints = self._footprints(blocks)
        self.plan = self.make_plan(blocks, example.to(ctx.device), stages)
        self.ranges, self.num_stages = self.plan.ranges, len(self.plan.ranges)
        self.placement = self.make_placement(self.num_stages, self.plan.replicas)
        if not self.virtual and self.placement.world_size != ctx.world_size:
            raise ValueError(f"the plan needs {self.placement.world_size} ranks, the run has {ctx.world_size}")
        block_shapes = output_shapes(blocks, example[:1].to(ctx.device))
        self.shapes = [tuple(example.shape[1:])] + [block_shapes[a - 1] for a, _ in self.ranges[1:]]
        ranks = range(self.placement.world_size) if self.virtual else [ctx.rank]
        # (rank, stage) -> Stage: every replica is its own copy of the stage's blocks, from the same initial weights
        self.workers = {(r, s): self._stage(s, blocks, copy=self.virtual and r != self.placement.ranks_of(s)[0])
                        for r in ranks for s in self.placement.stages_of(r)}
        wire = Wire(self.shapes, self.make_codec("act"), self.make_codec("grad"))
        if self.virtual:
            self.executor: Any = VirtualExecutor(self.workers, self.placement, wire, self.sync_mean)
        else:
            comms = replica_comms(ctx.comm, self.placement)
            mine = {s: stage for (_, s), stage in self.workers.items()}
            self.executor = ProcessExecutor(ctx.rank, mine, ctx.comm, self.placement, wire, comms,
                                            self.sync_mean, **self.executor_options())
        self.clock = StageClock(self.num_stages)
        if ctx.rank == 0:
            self._write_partition(measured=None)
            if ctx.log is not None:
                ctx.log("partition", ranges=self.ranges, replicas=self.plan.replicas, mode=self.plan.record["mode"],
                        predicted_s=[st["predicted_s"] for st in self.plan.record["predicted"]["stages"]])

    # -- memory: planned before the first step, measured by the stages ---------------------------------------------
    def _footprints(self, blocks: list[nn.Module]) -> list[Footprint]:
        """Every block's saved activations on the largest microbatch, fed through the chain as stages receive it
        (then the loss's), for the memory plan: one forward of the model on every rank."""
        train, device = self.ctx.workload.train, self.ctx.device
        index = torch.arange(min(len(train), max(self.microbatch_sizes())))
        loss = LossBlock(self.ctx.workload.loss, train.targets(index).to(device))
        prints = footprints([*blocks, loss], train.inputs(index).to(device), detach_inputs=True)
        self._transients = backward_transients(blocks, train.inputs(index).to(device), loss, prints,
                                               self.accumulates_gradients)
        self._retained = split_retained(blocks, train.inputs(index).to(device), loss) if self.backward_split else None
        return prints

    def schedule_at(self, step: int) -> Schedule:
        """The actions train_step runs at `step`, one list per rank (the memory plan walks the first steps')."""
        raise NotImplementedError(f"method {self.name!r} does not give its step schedules")

    def forward_lane(self) -> bool:
        """Whether a rank runs its forwards on a lane of their own, beside its backwards (default: one lane)."""
        return False

    def stage_walk(self, stages: int) -> StageWalk | None:
        """The planners' walk of a candidate stage in a pipeline of up to `stages` stages (core/memory.py), from the
        method's own steady-state step (None: it gives none, and the planners price nothing)."""
        step = type(self).step_schedule(max(stages, 1), getattr(self.ctx.params, "microbatches", 1))
        return StageWalk(step, self.forward_lane()) if step is not None else None

    def planned_stage_versions(self, after: int, alone: bool, held: int) -> int:
        """A candidate stage's policy's planned_versions (`after` stages after it; default: the live weights only)."""
        return 0

    def plan_optimizer(self, module: nn.Module, after: int) -> torch.optim.Optimizer:
        """The optimizer a candidate stage with `after` stages after it would have (default: make_optimizer's)."""
        return self.make_optimizer(0, module)

    def planned_terms(self, prints: list[Footprint], transients: list[int], module: nn.Module,
                      blocks: tuple[int, int], first: bool, after: int, held: int) -> StageTerms:
        """A candidate stage's terms for the planners, priced as stage_terms prices a built one: blocks [a, b) of
        the chain `prints` profiles, as `module`, with `after` stages after it, holding up to `held` microbatches."""
        return self._terms(prints, transients, module, blocks, first, after == 0, self.plan_optimizer(module, after),
                           self.planned_stage_versions(after, first and after == 0, held))

    def memory_plan(self) -> dict[int, MemoryBytes] | None:
        """Per rank (every rank in the virtual mode), its stages' planned bytes: the first 4S + 4 steps' schedules
        walked with each stage's profiled terms (core/step_bytes.py: what each action allocates and frees, as the
        executor runs it), the worst moment of each rank on top of what it holds throughout. None for a pipeline
        that does not give its step schedules (a plug-in without schedule_at): it plans nothing."""
        try:
            steps = [self.schedule_at(t) for t in range(4 * self.num_stages + 4)]
        except NotImplementedError:
            return None
        peaks = in_flight_peaks(steps, self.forward_lane())
        terms = {(rank, s): self.stage_terms(stage, peaks.get((rank, s), 0))
                 for (rank, s), stage in sorted(self.workers.items())}
        return rank_peaks(steps, terms, self.forward_lane())

    def stage_terms(self, stage: Stage, held: int) -> StageTerms:
        """The terms of `stage` holding up to `held` microbatches (core/memory.py's stage_terms)."""
        return self._terms(self._prints, self._transients, stage.module, self.ranges[stage.index], stage.first,
                           stage.last, stage.optimizer, stage.policy.planned_versions(held))

    def _terms(self, prints: list[Footprint], transients: list[int], module: nn.Module, blocks: tuple[int, int],
               first: bool, last: bool, optimizer: torch.optim.Optimizer, versions: int) -> StageTerms:
        params = sum(p.numel() * p.element_size() for p in module.parameters())
        return stage_terms(prints, blocks, first, last, [module], optimizer, self.make_codec("act"),
                           self.make_codec("grad"), self.batch_bytes(first, last), split=self.backward_split,
                           versions=versions * params, recompute=self.backward_mode == "current",
                           transients=transients, retained=self._retained)

    def batch_bytes(self, first: bool, last: bool) -> int:
        """A step's inputs (first stage) and labels (last stage) as the rank loads them."""
        return batch_bytes(self.ctx.workload.train, self.ctx.params.batch_size, inputs=first, targets=last)

    def memory_held(self) -> dict[int, MemoryBytes]:
        out: dict[int, MemoryBytes] = {}
        for (rank, _), stage in sorted(self.workers.items()):
            out[rank] = out.get(rank, MemoryBytes()) + held_bytes(stage)
        return out

    @property
    def virtual(self) -> bool:
        return self.ctx.world_size == 1

    @property
    def stages(self) -> dict[int, Stage]:
        """This rank's stages by index (in the virtual mode: every stage's first replica)."""
        out: dict[int, Stage] = {}
        for (_, s), stage in sorted(self.workers.items()):
            out.setdefault(s, stage)
        return out

    def _stage(self, s: int, blocks: list[nn.Module], copy: bool) -> Stage:
        a, b = self.ranges[s]
        module = nn.Sequential(*blocks[a:b])
        if copy:  # another replica in the virtual mode: its own copy of the same weights
            module = copy_module(module)
        optimizer = self.make_optimizer(s, module)
        policy = self.make_policy(s, self.num_stages, module, optimizer)
        stage = self.stage_class(s, self.num_stages, module, optimizer, policy, self.ctx.workload.loss,
                                 self.backward_mode)
        stage.clip_norm = self.ctx.params.grad_clip
        return stage

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizer of every stage replica on this rank (every replica of every stage in the virtual mode)."""
        return [stage.optimizer for _, stage in sorted(self.workers.items())]

    # -- running a schedule ----------------------------------------------------------------------------------------
    def run(self, schedule: Schedule, views: dict[int, Microbatches], step: int,
            then: Callable[[], dict[int, list[tuple[Action, float, float]]]] | None = None) -> StepStats:
        """Run `schedule` (one list per rank) for this rank or, in the virtual mode, for every rank. `then`, when
        given, runs right after it, as part of the step, and returns the actions it ran per rank with their
        perf_counter start and end (a clipped pipeline's updates): they join the rank's trace, so a traced step and
        its bubble include them."""
        if self.virtual:
            traces = self.executor.run(schedule, views)
        else:
            traces = [self.executor.run(schedule[self.ctx.rank], views)]
        ranks = range(self.placement.world_size) if self.virtual else [self.ctx.rank]
        if then is not None:
            ran = then()
            for rank, trace in zip(ranks, traces, strict=True):
                for action, start, end in ran.get(rank, []):
                    trace.add(action, start, end)
        for trace in traces:
            self.clock.add(trace)
        if self.ctx.log is not None and 1 <= step <= self.ctx.params.trace_steps:
            for rank, trace in zip(ranks, traces, strict=True):
                self.ctx.log("trace", step=step, worker=rank, events=trace.events)
        last = [st for (_, s), st in self.workers.items() if s == self.num_stages - 1]
        loss = sum(st.take_loss() for st in last) if last else None
        return StepStats(loss=loss, extra={**step_extra(traces, self.virtual), **memory_peaks(self.workers)})

    def drain(self, schedule: Schedule) -> StepStats:
        """Run the actions that complete what is still in flight after the last step (no new microbatch enters):
        the asynchronous pipelines' cool-down, so every minibatch of the budget is applied."""
        return self.run(schedule, self.views(None, [], []), -1)

    def microbatch_sizes(self, samples: int | None = None) -> list[int]:
        """`samples` (default: a full minibatch) cut into the params' M `microbatches` (else 1) consecutive
        microbatches. A full minibatch's sizes are those of every message of a microbatch cut in an earlier step
        (executor.Sizes)."""
        samples = self.ctx.params.batch_size if samples is None else samples
        return split_sizes(samples, getattr(self.ctx.params, "microbatches", 1))

    def views(self, batch: Batch | None, sizes: list[int], ids: list[int], iteration: int = 0
              ) -> dict[int, Microbatches]:
        """Each local stage's view of a step's microbatches (views.stage_views), of the microbatches this rank owns
        (all of them in the virtual mode)."""
        mine = range(self.num_stages) if self.virtual else self.placement.stages_of(self.ctx.rank)
        return stage_views(batch, sizes, ids, iteration, mine, self.num_stages - 1,
                           lambda s, mb: self.virtual or self.placement.owner(s, mb) == self.ctx.rank,
                           self.ctx.device, self.microbatch_sizes())

    # -- evaluation through the pipeline ---------------------------------------------------------------------------
    def evaluate(self, test: TensorData) -> EvalResult:
        """A forward-only pass of the test set through each stage's first replica with the live weights; the last
        stage counts (the totals are all-reduced, category `eval`), so every rank returns the global numbers."""
        last = self.num_stages - 1
        loss_fn = self.ctx.workload.loss
        first_replicas = [self.placement.ranks_of(s)[0] for s in range(self.num_stages)]
        rank_of = [0] * self.num_stages if self.virtual else first_replicas
        modules = {s: st.module for (r, s), st in self.workers.items() if r == first_replicas[s]}
        with eval_mode(list(modules.values())):
            totals = evaluate_chain(modules, rank_of, self.shapes, test, self.ctx.comm,
                                    self.ctx.params.eval_batch_size, self.ctx.device,
                                    lambda s, h, y: classifier_sums(h, y, loss_fn) if s == last else None,
                                    width=SUMS_WIDTH)
        n = float(totals[last, 2])
        return EvalResult(accuracy=float(totals[last, 0]) / n, loss=float(totals[last, 1]) / n)

    # -- partition record and end of run -----------------------------------------------------------------------------
    def _write_partition(self, measured: list[planning.StageTimes] | None) -> None:
        planning.write_partition(self.ctx.run_dir / "partition.json", self.name, self.plan,
                                 [list(g) for g in self.placement.stage_ranks], self.shapes, measured)

    def finish(self) -> None:
        """Complete the sends, then rank 0 writes partition.json with the measured stage times and trace.json, the
        traced steps in the Chrome trace format (every rank's trace records are in metrics.jsonl by then: the
        all-reduce of the measured times comes after each rank's last step)."""
        if not self.virtual:
            self.executor.flush()
        measured = self.clock.measured(None if self.virtual else self.ctx.comm)
        if self.ctx.rank == 0:
            self._write_partition(measured)
            metrics = self.ctx.run_dir / "metrics.jsonl"
            if metrics.exists():
                write_chrome_trace(metrics, self.ctx.run_dir / "trace.json")

