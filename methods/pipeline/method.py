"""The base of pipeline methods: the split, the stages on this rank, an executor, evaluation through the pipeline."""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator
from torch import nn

from harness.data.tensors import Batch, TensorData
from harness.method import EvalResult, Method, RunContext, StepStats, TrainParams
from harness.run.training import make_sgd
from harness.trace import busy_s, span_s, wait_s
from methods.blocks import (
    classifier_sums,
    default_parts,
    eval_mode,
    evaluate_chain,
    output_shapes,
    uniform_split,
)
from methods.pipeline import partitioner, profiler
from methods.pipeline.executor import Microbatches, ProcessExecutor, Trace, VirtualExecutor
from methods.pipeline.schedule import Schedule
from methods.pipeline.stage import Stage
from methods.pipeline.versions import WeightPolicy


class PipelineParams(TrainParams):
    stages: int | None = Field(default=None, ge=1,
                               description="pipeline stages; default: the world size (2 in the virtual mode)")
    partition: Literal["uniform", "auto"] | list[int] = Field(
        default="uniform", description="'uniform' (equal block counts), 'auto' (profile, then the partitioner), or "
                                       "the first block of every stage after the first, e.g. [2] for 2 stages")
    bandwidth: float = Field(default=1e9, gt=0, description="bytes/s between stages, for the 'auto' partitioner")
    trace_steps: int = Field(default=4, ge=0, description="steps (from step 1) whose full per-action trace is logged")

    @field_validator("partition")
    @classmethod
    def _increasing(cls, v: Any) -> Any:
        if isinstance(v, list) and (any(b < 1 for b in v) or v != sorted(set(v))):
            raise ValueError("stage boundaries must be increasing block indices >= 1")
        return v


@dataclass
class ComputeTimes:
    """One stage's measured compute over a run: total seconds and counts of forwards and backwards."""

    forward_s: float = 0.0
    forwards: int = 0
    backward_s: float = 0.0
    backwards: int = 0

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.forward_s, self.forwards, self.backward_s, self.backwards], dtype=torch.float64)

    def mean_forward_s(self) -> float:
        return self.forward_s / max(self.forwards, 1)

    def mean_backward_s(self) -> float:
        return self.backward_s / max(self.backwards, 1)


class PipelineMethod(Method):
    """Blocks split into S contiguous stages, one per rank (world size S), or all S in this process (world size 1:
    the virtual mode, same schedule and numerics). Subclasses give the schedule and the weight-version policy."""

    family = "pipeline"
    Params: ClassVar[type[PipelineParams]] = PipelineParams

    @classmethod
    def num_stages_for(cls, world_size: int, params: PipelineParams) -> int:
        return default_parts(params.stages, world_size)

    @classmethod
    def check_world_size(cls, world_size: int, params: PipelineParams) -> str | None:
        stages = cls.num_stages_for(world_size, params)
        if world_size > 1 and stages != world_size:
            return (f"stages = {stages} but world_size = {world_size}: one stage per rank (replicated stages are "
                    f"planned by the partitioner but not executed), or world_size 1 for the virtual mode")
        if isinstance(params.partition, list) and len(params.partition) != stages - 1:
            return f"partition lists {len(params.partition)} boundaries; {stages} stages need {stages - 1}"
        return super().check_world_size(world_size, params)

    @abc.abstractmethod
    def make_policy(self, stage: int, stages: int, module: nn.Module) -> WeightPolicy:
        """The weight-version policy of stage `stage` of `stages`, over its module."""

    def microbatch_size(self) -> int:
        """Samples per microbatch, for the profiler."""
        return self.ctx.params.batch_size

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.num_stages = self.num_stages_for(ctx.world_size, ctx.params)
        blocks = list(ctx.workload.make_model().to(ctx.device))
        if len(blocks) < self.num_stages:
            raise ValueError(f"the workload's model has {len(blocks)} blocks: too few for {self.num_stages} stages")
        example = ctx.workload.train.inputs(torch.arange(min(len(ctx.workload.train), self.microbatch_size())))
        self.ranges, self.plan = self._split(blocks, example.to(ctx.device))
        block_shapes = output_shapes(blocks, example[:1].to(ctx.device))
        # per-sample shape of the tensor entering each stage
        self.shapes = [tuple(example.shape[1:])] + [block_shapes[a - 1] for a, _ in self.ranges[1:]]
        mine = range(self.num_stages) if self.virtual else [ctx.rank]
        self.stages = {s: self._stage(s, blocks) for s in mine}
        if self.virtual:
            self.executor: Any = VirtualExecutor([self.stages[s] for s in range(self.num_stages)])
        else:
            self.executor = ProcessExecutor(self.stages[ctx.rank], ctx.comm, list(range(self.num_stages)),
                                            self.shapes)
        self.compute = {s: ComputeTimes() for s in range(self.num_stages)}
        if ctx.rank == 0:
            self._write_partition(measured=None)
            if ctx.log is not None:
                ctx.log("partition", ranges=self.ranges, mode=self.plan["mode"],
                        predicted_s=[st["predicted_s"] for st in self.plan["predicted"]["stages"]])

    @property
    def virtual(self) -> bool:
        return self.ctx.world_size == 1

    def _split(self, blocks: list[nn.Module], example: torch.Tensor) -> tuple[list[tuple[int, int]], dict]:
        """The stage ranges, and the plan: rank 0 profiles every block on a microbatch (before the train clock
        starts) so that every split, chosen or solved, comes with PipeDream's predicted stage times. With 'auto'
        rank 0 solves the partitioning DP and broadcasts the boundaries, so all ranks agree on the split."""
        params, n = self.ctx.params, len(blocks)
        bounds = torch.zeros(self.num_stages + 1, dtype=torch.int64)
        plan: dict = {"mode": params.partition if isinstance(params.partition, str) else "manual",
                      "bandwidth": params.bandwidth}
        if self.ctx.rank == 0:
            profiles = profiler.profile_blocks(blocks, example)
            if isinstance(params.partition, list):
                if params.partition[-1] >= n:
                    raise ValueError(f"partition {params.partition}: the model has only {n} blocks")
                ranges = list(zip([0, *params.partition], [*params.partition, n], strict=True))
            elif params.partition == "uniform":
                ranges = uniform_split(n, self.num_stages)
            else:
                ranges = partitioner.straight_partition(profiles, self.num_stages, params.bandwidth).ranges
                best = partitioner.pipedream_partition(profiles, max(self.ctx.world_size, self.num_stages),
                                                       params.bandwidth)
                plan["best_with_replication"] = best.to_dict()
            plan["predicted"] = partitioner.predict(profiles, ranges, params.bandwidth).to_dict()
            plan["profiles"] = profiler.profiles_to_dicts(profiles)
            bounds = torch.tensor([a for a, _ in ranges] + [n], dtype=torch.int64)
        if self.ctx.world_size > 1:
            self.ctx.comm.broadcast(bounds, 0, "control")
        b = bounds.tolist()
        return [(b[i], b[i + 1]) for i in range(self.num_stages)], plan

    def _stage(self, s: int, blocks: list[nn.Module]) -> Stage:
        a, b = self.ranges[s]
        module = nn.Sequential(*blocks[a:b])
        return Stage(s, self.num_stages, module, make_sgd(module.parameters(), self.ctx.params),
                     self.make_policy(s, self.num_stages, module), self.ctx.workload.loss)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizer of each stage on this rank (every stage in the virtual mode)."""
        return [stage.optimizer for stage in self.stages.values()]

    # -- running a schedule -----------------------------------------------------------------------------------------
    def run(self, schedule: Schedule, batches: dict[int, Microbatches], step: int) -> StepStats:
        """Run `schedule` (all stages' lists) for this rank or, in the virtual mode, for every stage."""
        if self.virtual:
            traces = self.executor.run(schedule, [batches[s] for s in range(self.num_stages)])
        else:
            traces = [self.executor.run(schedule[self.ctx.rank], batches[self.ctx.rank])]
        mine = range(self.num_stages) if self.virtual else [self.ctx.rank]
        for s, trace in zip(mine, traces, strict=True):
            times = self.compute[s]
            for event in trace.events:
                if event.op == "forward":
                    times.forward_s += event.duration
                    times.forwards += 1
                elif event.op == "backward":
                    times.backward_s += event.duration
                    times.backwards += 1
        if self.ctx.log is not None and 1 <= step <= self.ctx.params.trace_steps:
            for s, trace in zip(mine, traces, strict=True):
                self.ctx.log("trace", step=step, stage=s, events=trace.events)
        last = self.stages.get(self.num_stages - 1)
        loss = last.take_loss() if last is not None else None
        return StepStats(loss=loss, extra=self._step_extra(traces))

    def _step_extra(self, traces: list[Trace]) -> dict[str, Any]:
        if self.virtual:
            return {"busy_s": [busy_s(t.events) for t in traces]}
        events = traces[0].events
        return {"busy_s": busy_s(events), "wait_s": wait_s(events), "span_s": span_s(events)}

    def microbatches(self, batch: Batch, splits: list[torch.Tensor], ids: list[int]) -> dict[int, Microbatches]:
        """Each stage's view of the microbatches `splits` (sample ids), numbered `ids`."""
        out = {}
        total = len(batch)
        for s in self.stages:
            view = Microbatches(sizes={i: len(idx) for i, idx in zip(ids, splits, strict=True)})
            if s == 0:
                x = batch.inputs().to(self.ctx.device)
                for i, part in zip(ids, torch.split(x, [len(idx) for idx in splits]), strict=True):
                    view.inputs[i] = part
            if s == self.num_stages - 1:
                y = batch.targets().to(self.ctx.device)
                for i, part in zip(ids, torch.split(y, [len(idx) for idx in splits]), strict=True):
                    view.targets[i] = part
                    view.scales[i] = len(part) / total
            out[s] = view
        return out

    # -- evaluation through the pipeline ----------------------------------------------------------------------------
    def evaluate(self, test: TensorData) -> EvalResult:
        """A forward-only pass of the test set through the stages with the live weights; the last stage counts (the
        totals are all-reduced, category `eval`), so every rank returns the global numbers."""
        last = self.num_stages - 1
        loss_fn = self.ctx.workload.loss
        rank_of = [0] * self.num_stages if self.virtual else list(range(self.num_stages))
        modules = {s: st.module for s, st in self.stages.items()}
        with eval_mode(list(modules.values())):
            totals = evaluate_chain(modules, rank_of, self.shapes, test, self.ctx.comm,
                                    self.ctx.params.eval_batch_size, self.ctx.device,
                                    lambda s, h, y: classifier_sums(h, y, loss_fn) if s == last else None, width=2)
        n = len(test)
        return EvalResult(accuracy=float(totals[last, 0]) / n, loss=float(totals[last, 1]) / n)

    # -- partition record and end of run ----------------------------------------------------------------------------
    def _measured(self) -> list[ComputeTimes]:
        """Per stage, the measured compute over the run (summed over ranks: each rank measured its own stages)."""
        table = torch.stack([self.compute[s].as_tensor() for s in range(self.num_stages)])
        if not self.virtual:
            self.ctx.comm.all_reduce(table, "control")
        return [ComputeTimes(float(row[0]), int(row[1]), float(row[2]), int(row[3])) for row in table]

    def _write_partition(self, measured: list[ComputeTimes] | None) -> None:
        """partition.json: the split, each stage's predicted time (from the profiles) next to its measured one (the
        mean forward and backward of one microbatch over the run), the profiles, and for 'auto' the DP's best plan
        with replication over the same workers."""
        predicted = self.plan.get("predicted", {}).get("stages") or [{} for _ in range(self.num_stages)]
        stages = []
        for s, ((a, b), pred) in enumerate(zip(self.ranges, predicted, strict=True)):
            row = {"stage": s, "blocks": [a, b], "predicted_compute_s": pred.get("compute_s"),
                   "predicted_s": pred.get("predicted_s")}
            if measured is not None:
                forward, backward = measured[s].mean_forward_s(), measured[s].mean_backward_s()
                row.update(measured_forward_s=forward, measured_backward_s=backward,
                           measured_compute_s=forward + backward)
            stages.append(row)
        record = {"method": self.name, "stages": stages, "input_shapes": self.shapes, **self.plan}
        (self.ctx.run_dir / "partition.json").write_text(json.dumps(record, indent=1))

    def finish(self) -> None:
        if not self.virtual:
            self.executor.flush()
        measured = self._measured()
        if self.ctx.rank == 0:
            self._write_partition(measured)
