"""APapo (Liu and Ju, FGCS 2024): an augmented-antichain DP partition onto the measured hardware, a multi-iteration
asynchronous pipeline with double-buffered weights, and computation overlapped with communication."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from itertools import accumulate
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from harness.data.tensors import Batch
from harness.memory import DoesNotFit, Footprint, LossBlock
from harness.method import RunContext, StepStats
from harness.schedule.ir import Schedule
from harness.split import uniform_split
from harness.trace import StepSchedule
from methods.blocks import VIRTUAL_DEFAULT_PARTS, too_few
from methods.pipeline.apapo import antichain, layers
from methods.pipeline.apapo import schedule as schedules
from methods.pipeline.apapo.hardware import hardware_for
from methods.pipeline.apapo.memory import GraphMemory, copied_transients, shapes, stage_bytes
from methods.pipeline.apapo.plan import LayerPlan, agree, why
from methods.pipeline.apapo.weights import DoubleBuffered
from methods.pipeline.compensation.prediction import NO_VELOCITY
from methods.pipeline.compensation.spike import SpikeCompensatedSGD
from methods.pipeline.core.base import PipelineMethod
from methods.pipeline.core.block_profile import profiles_to_dicts
from methods.pipeline.core.interleaver import Interleaver
from methods.pipeline.core.overlap import ArrivalWatch, overlap_summary, read_records
from methods.pipeline.core.params import PipelineParams
from methods.pipeline.core.partitioner import NoPlanFits
from methods.pipeline.core.placement import Placement, place
from methods.pipeline.core.plan_memory import nothing_fits
from methods.pipeline.core.planning import Plan
from methods.pipeline.core.versions import WeightPolicy


class APapoParams(PipelineParams):
    microbatches: int = Field(default=4, ge=1, description="microbatches per iteration (M); one update per iteration")
    iterations_in_flight: int = Field(default=2, ge=1, description="K: iterations a stage may have in flight; weights "
                                      "are K-1 versions old (2: PipeDream-2BW's double buffering; 1: a flush)")
    delays: schedules.DelayRule = Field(
        default="per_stage", description="per_stage (default): each stage's weights only as old as its place in 1F1B "
        "needs (ceil((S-1-s)/M) versions, at most K-1: none at the last stage); uniform: every stage's K-1 versions "
        "old (PipeDream-2BW)")
    compensation: Literal["none", "sc"] = Field(
        default="none", description="sc: spike compensation SC_D with each stage's delay D_s (Kosson et al.); "
        "none: the run's momentum SGD")
    prediction: Literal["none", "lwp_v"] = Field(
        default="lwp_v", description="lwp_v (default; 'none' when momentum is 0, which keeps no velocity): each "
        "stage's forwards and backwards run on its version predicted D_s updates ahead, w - lr·D·v; none: the "
        "version as it is")
    partition: Literal["antichain", "uniform"] | list[int] = Field(
        default="antichain", description="'antichain' (the DP over the layer graph's down-sets, on the measured "
        "ranks and links), 'uniform' (equal layer counts in topological order), or the first layer node of every "
        "stage after the first (node 0 is the input)")
    replicas: list[int] | None = Field(default=None, description="with 'uniform' or a list: replicas of each stage "
                                       "(default one rank each); 'antichain' chooses them itself")
    replicate: bool = Field(default=True, description="antichain: may replicate stages where it pays (False: one "
                            "rank per stage, as many stages as ranks)")
    profile: Literal["measured", "counted"] = Field(
        default="counted", description="the layer costs the DP plans with: 'counted' (default: FLOPs, bytes moved and "
        "a per-pass overhead on a nominal rank, the same on every run and machine) or 'measured' (each layer timed on "
        "rank 0, which moves the cut from run to run)")
    overlap: bool = Field(default=True, description="receives posted ahead and completed by a communication thread, "
                          "sends in the background (False: every transfer blocks at its action)")
    rank_speeds: Literal["measured"] | list[float] = Field(
        default="measured", description="each rank's compute speed relative to rank 0, or 'measured' (snapped to "
        "powers of sqrt 2, so equal ranks plan as equal)")
    bandwidth: Literal["measured"] | float | list[list[float]] = Field(  # type: ignore[assignment]
        default="measured", description="bytes/s of every link: one number, a ranks x ranks matrix, or 'measured' "
        "(snapped to powers of 2)")

    @property
    def plan_pinned(self) -> bool:
        """Whether the plan is the same on every machine and load: one rank per stage (`replicate = false`: always
        an asynchronous pipeline), or the DP's inputs fixed (`rank_speeds` and `bandwidth` given, not measured).
        A claim that judges apapo judges such a run; a plan from measured ranks may turn into data parallelism."""
        return not self.replicate or (self.rank_speeds != "measured" and self.bandwidth != "measured")

    @model_validator(mode="after")
    def _momentum_sgd(self) -> APapoParams:
        """Spike compensation and velocity prediction need momentum SGD as SC and LWP define it."""
        if self.compensation == "sc" and self.nesterov:
            raise ValueError("compensation = 'sc' is undampened heavy-ball momentum, not Nesterov's: set "
                             "nesterov = false")
        if self.optimizer != "sgd" and self.compensation == "sc":
            raise ValueError(f"optimizer = {self.optimizer!r} with compensation = 'sc': spike compensation acts on "
                             "momentum SGD's velocity; use optimizer = 'sgd' or compensation = 'none'")
        if self.prediction == "lwp_v" and (self.momentum == 0 or self.optimizer != "sgd"):
            if "prediction" in self.model_fields_set:
                if self.optimizer != "sgd":
                    raise ValueError(f"optimizer = {self.optimizer!r} with prediction = 'lwp_v': it predicts with "
                                     "momentum SGD's velocity; use optimizer = 'sgd' or prediction = 'none'")
                raise ValueError(NO_VELOCITY)
            self.prediction = "none"  # the default without SGD's momentum (spec.json records the resolved value)
        return self


class APapo(PipelineMethod):
    """APapo, as read from its abstract (the paper is not public; docs/methods.md says what is taken from where).

    1. Partition: the model's layer graph (torch.fx: ResNet's skip connections are edges) is cut by PipeDream's
       augmented-antichain DP (antichain.py): the states are the graph's down-sets, a stage is the difference of two
       nested ones, and each stage gets a group of ranks (replicated where it pays) so that the slowest stage or
       boundary transfer is smallest, with every rank's measured speed and every link's measured bandwidth. A stage
       may receive several tensors (a skip connection crossing the cut): they travel as one flat payload.
    2. Schedule (schedule.py): iteration t is M microbatches and one update per stage. Stages run 1F1B over
       the stream of microbatches without flushing, so K = iterations_in_flight iterations overlap; the forward
       and the backward of iteration t on stage s use weight version t - D_s. With `delays = "per_stage"` (the
       default) D_s = min(K - 1, ceil((S - 1 - s) / M)): each stage only as stale as its place in 1F1B needs, the
       last stage never; with "uniform", D_s = K - 1 on every stage (D = 1: PipeDream-2BW,
       W(t+1) = W(t) - lr·grad f(W(t-1))). A single stage has D = 0 and is SGD with M-microbatch accumulation. The
       version used may be predicted D_s updates ahead (`prediction = "lwp_v"`, the default with momentum SGD) or
       spike-compensated (`compensation = "sc"`). A gate holds a stage's forwards until that version exists
       (bubbles when M < S - 1).
    3. Overlap: receives are posted ahead and completed by a communication thread, sends run in the background;
       `overlap = false` makes every transfer block at its action. Per stage, compute, communication and hidden
       time go to partition.json (overlap.py).
    """

    name = "apapo"
    summary = ("APapo: antichain DP onto measured ranks, asynchronous multi-iteration pipeline with per-stage delays, "
               "overlap (Liu 2024)")
    Params: ClassVar[type[APapoParams]] = APapoParams

    # -- what the suite may ask for --------------------------------------------------------------------------------
    @classmethod
    def requested_stages(cls, world_size: int, params: APapoParams) -> int | None:
        return None if params.partition == "antichain" else super().requested_stages(world_size, params)

    @classmethod
    def check_world_size(cls, world_size: int, params: APapoParams) -> str | None:
        ranks = cls.planned_workers(world_size, params)
        if isinstance(params.rank_speeds, list) and len(params.rank_speeds) != ranks:
            return f"rank_speeds lists {len(params.rank_speeds)} ranks; the plan has {ranks}"
        if isinstance(params.bandwidth, list) and (len(params.bandwidth) != ranks
                                                   or any(len(row) != ranks for row in params.bandwidth)):
            return f"bandwidth must be a {ranks}x{ranks} matrix"
        return super().check_world_size(world_size, params)

    @classmethod
    def check_placement(cls, world_size: int, params: APapoParams) -> str | None:
        """The antichain plan places stages on the ranks itself (no one-stage-per-rank rule); the other partitions
        keep the pipelines' rule."""
        if params.partition == "antichain":
            return "partition 'antichain' chooses the replicas itself: leave replicas unset" \
                if params.replicas is not None else None
        return super().check_placement(world_size, params)

    @classmethod
    def check_model(cls, world_size: int, params: APapoParams, model: Callable[[], nn.Sequential]
                    ) -> tuple[str, str] | None:
        """Stages are cut from the layer graph: a plan of one rank per stage, or a uniform or listed partition,
        needs a layer per stage (a replicating antichain plan chooses fewer stages itself)."""
        if params.partition == "antichain" and params.replicate:
            return None
        count = layers.layer_count(model())
        if params.partition == "antichain":
            stages, field = cls.planned_workers(world_size, params), "world_size" if world_size > 1 else "stages"
        else:
            stages, field = cls.requested_stages(world_size, params), cls.stages_field(world_size, params)
        if stages is not None and stages > count:
            return field, too_few(stages, "stages", count, "layers")
        if isinstance(params.partition, list) and params.partition[-1] > count:
            return "partition", (f"partition {params.partition}: the layer graph has nodes 0..{count} "
                                 f"(0 is the input)")
        return None

    @classmethod
    def planned_workers(cls, world_size: int, params: APapoParams) -> int:
        """The ranks the plan spreads over: the run's, or in the virtual mode the simulated ones (the replicas' sum,
        else `stages`, else 2)."""
        if world_size > 1:
            return world_size
        if params.replicas is not None:
            return sum(params.replicas)
        return params.stages or VIRTUAL_DEFAULT_PARTS

    # -- hooks -----------------------------------------------------------------------------------------------------
    def __init__(self, ctx: RunContext):
        self.watch = ArrivalWatch() if ctx.world_size > 1 and ctx.params.overlap else None
        self.layer_plan = LayerPlan([], ())  # the partition (make_blocks: the planner's, agreed by every rank)
        super().__init__(ctx)
        gc.collect()  # torch.fx's modules are cycles (module <-> graph): the stages this rank does not run go now
        self.delays = self.stage_delays(self.num_stages)
        self.iterations = 0  # steps run; the drain completes what is still in flight
        self._check_schedule(ctx.params.iterations_in_flight + 3)

    def microbatch_size(self) -> int:
        return max(1, self.ctx.params.batch_size // self.ctx.params.microbatches)

    def stage_delays(self, stages: int) -> tuple[int, ...]:
        """Every stage's delay D_s (schedules.version_delays under the run's `delays` rule)."""
        p = self.ctx.params
        return schedules.version_delays(stages, p.microbatches, p.iterations_in_flight, p.delays)

    def make_optimizer(self, stage: int, module: nn.Module, delay: int | None = None) -> torch.optim.Optimizer:
        """With compensation 'sc': spike-compensated SGD for the stage's delay (or `delay`); else the run's SGD."""
        p = self.ctx.params
        if not any(w.requires_grad for w in module.parameters()):  # a weightless stage the DP may cut: no state
            module = nn.ParameterList([nn.Parameter(torch.empty(0), requires_grad=False)])
        if p.compensation == "none":
            return super().make_optimizer(stage, module)
        delay = self.stage_delays(self.num_stages)[stage] if delay is None else delay
        return SpikeCompensatedSGD(module.parameters(), lr=p.applied_lr, momentum=p.applied_momentum, delay=delay,
                                   weight_decay=p.weight_decay)

    def make_policy(self, stage: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> WeightPolicy:
        p = self.ctx.params
        return DoubleBuffered(module, p.microbatches, self.stage_delays(stages)[stage], optimizer, p.prediction)

    def make_placement(self, stages: int, replicas: list[int]) -> Placement:
        return Placement(self.layer_plan.groups)

    def executor_options(self) -> dict[str, Any]:
        return {"overlap": self.ctx.params.overlap, "watch": self.watch}

    def make_blocks(self, example: torch.Tensor) -> list[nn.Module]:
        """Trace the model, plan on rank 0 (profiles, hardware, the DP: a LayerPlan), agree on it (plan.agree), and
        cut: one block per stage."""
        ctx, params = self.ctx, self.ctx.params
        model = ctx.workload.make_model().to(ctx.device)
        workers = self.planned_workers(ctx.world_size, params)
        traced = layers.trace(model, example, profile=params.profile if ctx.rank == 0 else "none")
        hardware, raw = hardware_for(ctx.comm, model, example, workers, params.rank_speeds, params.bandwidth)
        solved, refused = None, None
        if ctx.rank == 0:
            try:
                prefixes, groups, record = self._solve(traced, hardware, workers, self._graph_memory(traced))
                solved = LayerPlan(prefixes, groups, {**record, "measured_before_snapping": raw})
            except DoesNotFit as exc:  # every rank learns it through the plan (no stage): none waits
                refused, solved = exc, LayerPlan([], ())
        self.layer_plan = agree(solved, traced.graph.size, workers, ctx.comm if ctx.world_size > 1 else None)
        if not self.layer_plan.prefixes:
            raise refused or DoesNotFit("does not fit: rank 0's planner found no plan within memory_per_rank")
        return list(layers.split(traced, self.layer_plan.prefixes))

    def _profile_batch(self) -> tuple[torch.Tensor, LossBlock]:
        """The run's largest microbatch of training inputs, and the loss on its labels (what the plans profile)."""
        train, device = self.ctx.workload.train, self.ctx.device
        index = torch.arange(min(len(train), max(self.microbatch_sizes())))
        return train.inputs(index).to(device), LossBlock(self.ctx.workload.loss, train.targets(index).to(device))

    def _footprints(self, blocks: list[nn.Module]) -> list[Footprint]:
        """Every pipeline's, with a stage of delay D > 0 differentiating a copy of its weights (copied_transients)."""
        prints = super()._footprints(blocks)
        self._transients = copied_transients(blocks, *self._profile_batch(), prints, self._transients,
                                             self.stage_delays(len(blocks)))
        return prints

    def _graph_memory(self, traced: layers.TracedModel) -> GraphMemory:
        """The planner's price of a down-set stage (apapo/memory.py): built and profiled on the run's largest
        microbatch, priced by the runner's terms (planned_terms) and walk (stage_walk)."""
        walk = self.stage_walk(self.planned_workers(self.ctx.world_size, self.ctx.params))  # APapo gives its step
        return GraphMemory(walk, traced, *self._profile_batch(), lambda prints, transients, module, i, first, after,  # type: ignore[arg-type]
                           held: self.planned_terms(prints, transients, module, (i, i + 1), first, after, held),
                           lambda first, last: not (first and last) and self.planned_delay(0 if last else 1) > 0)

    def planned_delay(self, after: int) -> int:
        """The delay D of a stage with `after` stages after it (stage_delays' rule, by its place from the end)."""
        p, most = self.ctx.params, self.ctx.params.iterations_in_flight - 1
        return min(most, -(-after // p.microbatches)) if p.delays == "per_stage" else most

    def planned_stage_versions(self, after: int, alone: bool, held: int) -> int:
        """D + 1 double-buffered versions at a stage of delay D > 0, none at D = 0."""
        return 0 if alone or self.planned_delay(after) == 0 else self.planned_delay(after) + 1

    def plan_optimizer(self, module: nn.Module, after: int) -> torch.optim.Optimizer:
        return self.make_optimizer(0, module, delay=self.planned_delay(after))

    def _solve(self, traced: layers.TracedModel, hardware: antichain.Hardware, workers: int, memory: GraphMemory
               ) -> tuple[list[int], list[tuple[int, ...]], dict[str, Any]]:
        """Rank 0: the plan's down-sets and rank groups, and what partition.json records about it. Under
        memory_per_rank the antichain DP keeps to plans whose every stage fits (DoesNotFit when none does)."""
        params, graph, budget = self.ctx.params, traced.graph, self.ctx.memory_per_rank
        record: dict[str, Any] = {"mode": params.partition if isinstance(params.partition, str) else "manual",
                                  "profile": params.profile, "rank_speeds": hardware.speeds,
                                  "bandwidth": hardware.bandwidth}
        if params.partition == "antichain":
            try:
                plan = antichain.antichain_partition(graph, hardware, params.stages, params.replicate,
                                                     memory if budget is not None else None, budget)
            except NoPlanFits:
                raise nothing_fits(shapes(graph, hardware, workers, params.stages, None, memory, budget),
                                   budget) from None
            prefixes = list(accumulate((sum(1 << i for i in st.nodes) for st in plan.stages), lambda a, b: a | b))
            groups = [stage.ranks for stage in plan.stages]
            record["dp_states"] = plan.states
            record["choice"] = why(graph, hardware, workers, plan, params)
        else:
            count = self.requested_stages(self.ctx.world_size, params)
            layer_count = graph.size - 1  # node 0 is the input
            starts = ([a + 1 for a, _ in uniform_split(layer_count, count)][1:] if params.partition == "uniform"
                      else list(params.partition))
            if starts and starts[-1] >= graph.size:
                raise ValueError(f"partition {starts}: the layer graph has nodes 0..{graph.size - 1}")
            prefixes = [graph.topological_prefix(b) for b in starts] + [graph.full]
            replicas = params.replicas or [1] * count
            groups, first = [], 0
            for r in replicas:
                groups.append(tuple(range(first, first + r)))
                first += r
        predicted = antichain.predict(graph, hardware, prefixes, groups)
        record["memory"] = {"memory_per_rank": budget, "stage_bytes": stage_bytes(predicted, memory),
                            "held_microbatches": [memory.walk.held(len(g), len(groups) - 1 - i)
                                                  for i, g in enumerate(groups)],
                            "candidates": shapes(graph, hardware, workers, params.stages, predicted, memory, budget)}
        record["predicted"] = {"slowest_s": predicted.slowest_s,
                               "stages": [{"compute_s": s.compute_s, "predicted_s": max(s.predicted_s, s.transfer_s),
                                           "transfer_s": s.transfer_s, "sync_s": s.sync_s} for s in predicted.stages]}
        record["graph_plan"] = predicted.to_dict(graph)
        record["layers"] = [{"name": name, "inputs": [graph.names[p] for p in graph.preds[i]], **profile}
                            for i, (name, profile) in enumerate(zip(graph.names, profiles_to_dicts(graph.profiles),
                                                                    strict=True))]
        return prefixes, groups, record

    def make_plan(self, blocks: list[nn.Module], example: torch.Tensor, stages: int | None) -> Plan:
        record = self.layer_plan.record
        params = self.ctx.params
        record["schedule"] = {"microbatches": params.microbatches, "iterations_in_flight": params.iterations_in_flight,
                              "delays": list(self.stage_delays(len(blocks))), "delay_rule": params.delays,
                              "compensation": params.compensation, "prediction": params.prediction,
                              "overlap": params.overlap}
        return Plan([(s, s + 1) for s in range(len(blocks))], [len(g) for g in self.layer_plan.groups], record)

    # -- the schedule ----------------------------------------------------------------------------------------------
    def _placed(self, per_stage) -> Schedule:
        return place([per_stage(s) for s in range(self.num_stages)], self.placement)

    @classmethod
    def step_schedule(cls, stages: int, microbatches: int) -> StepSchedule:
        """Step t0 of the run's segments (schedule.segment) at the default K and delay rule, one stage per rank, t0
        past every stage's delay (the steady state); step t0+k is it with microbatch ids plus k·M and iteration ids
        plus k (a microbatch is named by its global number and its iteration). The planner's layout (data
        parallelism, replicas) is not re-shaped: this is the schedule of a pipeline of `stages` stages."""
        fields = cls.Params.model_fields
        delays = schedules.version_delays(stages, microbatches, fields["iterations_in_flight"].default,
                                          fields["delays"].default)
        t0 = max(delays) + 2
        return StepSchedule([schedules.segment(s, stages, microbatches, delays, t0) for s in range(stages)],
                            shift=microbatches, iteration_shift=1)

    def schedule_at(self, step: int) -> Schedule:
        return self.segment(step)

    def segment(self, iteration: int) -> Schedule:
        """Step `iteration`'s actions, one list per rank."""
        m, s_count = self.ctx.params.microbatches, self.num_stages
        return self._placed(lambda s: schedules.segment(s, s_count, m, self.delays, iteration))

    def _check_schedule(self, iterations: int) -> None:
        """Run the first steps and a drain through the Interleaver (no deadlock, streams in order, nothing left)."""
        m, s_count = self.ctx.params.microbatches, self.num_stages
        check = Interleaver(self.placement)
        for t in range(iterations):
            check.advance(self.segment(t))
        check.advance(self._placed(lambda s: schedules.apapo_drain(s, s_count, m, self.delays, iterations)))
        if check.in_flight:
            raise RuntimeError(f"apapo's schedule leaves messages unreceived: {sorted(check.in_flight)}")

    def train_step(self, batch: Batch) -> StepStats:
        t, m = batch.step, self.ctx.params.microbatches
        self.iterations = t + 1
        sizes = self.microbatch_sizes(len(batch))
        views = self.views(batch, sizes, [t * m + j for j in range(m)], iteration=t)
        stats = self.run(self.segment(t), views, t)
        if self.watch is not None:
            arrived = self.watch.take()
            if self.ctx.log is not None and 1 <= t <= self.ctx.params.trace_steps:
                self.ctx.log("arrivals", step=t, worker=self.ctx.rank,
                             messages=[[*message, at] for message, at in arrived.items()])
        return stats

    def end_training(self) -> None:
        t, m = self.iterations, self.ctx.params.microbatches
        self.drain(self._placed(lambda s: schedules.apapo_drain(s, self.num_stages, m, self.delays, t)))

    def finish(self) -> None:
        """As every pipeline, then (rank 0) the overlap accounting of the traced steps into partition.json."""
        super().finish()
        if self.watch is not None:
            self.watch.close()
        metrics, partition = self.ctx.run_dir / "metrics.jsonl", self.ctx.run_dir / "partition.json"
        if self.ctx.rank == 0 and not self.virtual and metrics.exists() and partition.exists():
            summary = overlap_summary(read_records(metrics))
            record = json.loads(partition.read_text())
            record["overlap"] = summary
            partition.write_text(json.dumps(record, indent=1))
            if self.ctx.log is not None:
                self.ctx.log("overlap", **summary)
