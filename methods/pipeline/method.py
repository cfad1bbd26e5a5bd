"""The base of pipeline methods: the split, the stages on this rank, an executor, evaluation through the pipeline."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator
from torch import nn

from harness.data import Batch, TensorData
from harness.method import EvalResult, Method, RunContext, StepStats, TrainParams
from harness.training import make_sgd
from methods.pipeline import partitioner, profiler
from methods.pipeline.executor import Micro, ProcessExecutor, Trace, VirtualExecutor
from methods.pipeline.schedule import Schedule
from methods.pipeline.stage import Stage
from methods.pipeline.versions import WeightPolicy

TAG_EVAL = 33


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


class PipelineMethod(Method):
    """Blocks split into S contiguous stages, one per rank (world size S), or all S in this process (world size 1:
    the virtual mode, same schedule and numerics). Subclasses give the schedule and the weight-version policy."""

    family = "pipeline"
    Params: ClassVar[type[PipelineParams]] = PipelineParams

    @classmethod
    def num_stages(cls, world_size: int, params: PipelineParams) -> int:
        return params.stages or (world_size if world_size > 1 else 2)

    @classmethod
    def check_world_size(cls, world_size: int, params: PipelineParams) -> str | None:
        stages = cls.num_stages(world_size, params)
        if world_size > 1 and stages != world_size:
            return (f"stages = {stages} but world_size = {world_size}: one stage per rank (replicated stages are "
                    f"planned by the partitioner but not executed), or world_size 1 for the virtual mode")
        if isinstance(params.partition, list) and len(params.partition) != stages - 1:
            return f"partition lists {len(params.partition)} boundaries; {stages} stages need {stages - 1}"
        return super().check_world_size(world_size, params)

    def make_policy(self, stage: int, stages: int, module: nn.Module) -> WeightPolicy:
        raise NotImplementedError

    def microbatch_size(self) -> int:
        """Samples per microbatch, for the profiler."""
        return self.ctx.params.batch_size

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        p = ctx.params
        self.S = self.num_stages(ctx.world_size, p)
        blocks = list(ctx.workload.make_model().to(ctx.device))
        if len(blocks) < self.S:
            raise ValueError(f"the workload's model has {len(blocks)} blocks: too few for {self.S} stages")
        example = ctx.workload.train.inputs(torch.arange(min(len(ctx.workload.train), self.microbatch_size())))
        self.ranges, self.plan = self._split(blocks, example.to(ctx.device))
        with torch.no_grad():  # per-sample shapes of the tensors entering each stage
            shapes, h = [tuple(example.shape[1:])], example[:1].to(ctx.device)
            for a, b in self.ranges:
                for block in blocks[a:b]:
                    h = block(h)
                shapes.append(tuple(h.shape[1:]))
        self.shapes = shapes[:-1]
        mine = range(self.S) if self.virtual else [ctx.rank]
        self.stages = {s: self._stage(s, blocks) for s in mine}
        if self.virtual:
            self.executor: Any = VirtualExecutor([self.stages[s] for s in range(self.S)])
        else:
            self.executor = ProcessExecutor(self.stages[ctx.rank], ctx.comm, list(range(self.S)), self.shapes)
        self._steps = 0
        self._compute = torch.zeros(self.S, 4, dtype=torch.float64)  # per stage: forward s, count, backward s, count
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
        p, n = self.ctx.params, len(blocks)
        bounds = torch.zeros(self.S + 1, dtype=torch.int64)
        plan: dict = {"mode": p.partition if isinstance(p.partition, str) else "manual", "bandwidth": p.bandwidth}
        if self.ctx.rank == 0:
            profiles = profiler.profile_blocks(blocks, example)
            if isinstance(p.partition, list):
                if p.partition[-1] >= n:
                    raise ValueError(f"partition {p.partition}: the model has only {n} blocks")
                ranges = list(zip([0, *p.partition], [*p.partition, n], strict=True))
            elif p.partition == "uniform":
                ranges = partitioner.uniform_partition(n, self.S)
            else:
                ranges = partitioner.straight_partition(profiles, self.S, p.bandwidth).ranges
                best = partitioner.pipedream_partition(profiles, max(self.ctx.world_size, self.S), p.bandwidth)
                plan["best_with_replication"] = best.to_dict()
            plan["predicted"] = partitioner.predict(profiles, ranges, p.bandwidth).to_dict()
            plan["profiles"] = profiler.profiles_to_dicts(profiles)
            bounds = torch.tensor([a for a, _ in ranges] + [n], dtype=torch.int64)
        if self.ctx.world_size > 1:
            self.ctx.comm.broadcast(bounds, 0, "control")
        b = bounds.tolist()
        return [(b[i], b[i + 1]) for i in range(self.S)], plan

    def _stage(self, s: int, blocks: list[nn.Module]) -> Stage:
        a, b = self.ranges[s]
        module = nn.Sequential(*blocks[a:b])
        return Stage(s, self.S, module, make_sgd(module.parameters(), self.ctx.params),
                     self.make_policy(s, self.S, module), self.ctx.workload.loss)

    # -- running a schedule -----------------------------------------------------------------------------------------
    def run(self, schedule: Schedule, micros: dict[int, Micro], step: int) -> StepStats:
        """Run `schedule` (all stages' lists) for this rank or, in the virtual mode, for every stage."""
        if self.virtual:
            traces = self.executor.run(schedule, [micros[s] for s in range(self.S)])
        else:
            traces = [self.executor.run(schedule[self.ctx.rank], micros[self.ctx.rank])]
        mine = range(self.S) if self.virtual else [self.ctx.rank]
        for s, trace in zip(mine, traces, strict=True):
            for op, _, t0, t1, _ in trace.events:
                if op in ("forward", "backward"):
                    col = 0 if op == "forward" else 2
                    self._compute[s, col] += t1 - t0
                    self._compute[s, col + 1] += 1
        if self.ctx.log is not None and 1 <= step <= self.ctx.params.trace_steps:
            for s, trace in zip(mine, traces, strict=True):
                self.ctx.log("trace", step=step, stage=s, events=trace.events)
        last = self.stages.get(self.S - 1)
        loss = last.take_loss() if last is not None else None
        extra = self._step_extra(traces)
        self._steps += 1
        return StepStats(loss=loss, extra=extra)

    def _step_extra(self, traces: list[Trace]) -> dict[str, Any]:
        if self.virtual:
            return {"busy_s": [t.busy_s() for t in traces]}
        t = traces[0]
        return {"busy_s": t.busy_s(), "wait_s": t.wait_s(), "span_s": t.span_s()}

    def micros(self, batch: Batch, splits: list[torch.Tensor], ids: list[int]) -> dict[int, Micro]:
        """Each stage's view of the microbatches `splits` (sample ids), numbered `ids`."""
        out = {}
        total = len(batch)
        for s in self.stages:
            micro = Micro(sizes={i: len(idx) for i, idx in zip(ids, splits, strict=True)})
            if s == 0:
                x = batch.inputs().to(self.ctx.device)
                for i, part in zip(ids, torch.split(x, [len(idx) for idx in splits]), strict=True):
                    micro.inputs[i] = part
            if s == self.S - 1:
                y = batch.targets().to(self.ctx.device)
                for i, part in zip(ids, torch.split(y, [len(idx) for idx in splits]), strict=True):
                    micro.targets[i] = part
                    micro.scales[i] = len(part) / total
            out[s] = micro
        return out

    # -- evaluation through the pipeline ----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, test: TensorData) -> EvalResult:
        """A forward-only pass of the test set through the stages with the live weights; the last stage counts, and
        its totals are broadcast (category `eval`), so every rank returns the global numbers."""
        comm, size, n = self.ctx.comm, self.ctx.params.eval_batch_size, len(test)
        loss_fn, device = self.ctx.workload.loss, self.ctx.device
        totals = torch.zeros(2, dtype=torch.float64)
        for st in self.stages.values():
            st.module.eval()
        sends, keep = [], []
        for start in range(0, n, size):
            idx = torch.arange(start, min(n, start + size))
            h = None
            for s, st in sorted(self.stages.items()):
                if s == 0:
                    h = test.inputs(idx).to(device)
                elif h is None:
                    h = torch.empty((len(idx), *self.shapes[s]), device=device)
                    comm.recv(h, s - 1, "eval", TAG_EVAL)
                h = st.module(h)
                if s == self.S - 1:
                    y = test.targets(idx).to(device)
                    totals[0] += (h.argmax(dim=1) == y).sum().double().cpu()
                    totals[1] += loss_fn(h, y, reduction="sum").double().cpu()
                elif not self.virtual:
                    keep.append(h)
                    sends.append(comm.isend(h, s + 1, "eval", TAG_EVAL))
        for work in sends:
            work.wait()
        for st in self.stages.values():
            st.module.train()
        if not self.virtual:
            comm.broadcast(totals, self.S - 1, "eval")
        return EvalResult(accuracy=float(totals[0]) / n, loss=float(totals[1]) / n)

    # -- partition record and end of run ----------------------------------------------------------------------------
    def _measured(self) -> list[dict[str, float]]:
        """Per stage: the mean measured forward and backward time of one microbatch."""
        c = self._compute.clone()
        if not self.virtual:
            self.ctx.comm.all_reduce(c, "control")
        return [{"forward_s": float(c[s, 0] / max(c[s, 1], 1)), "backward_s": float(c[s, 2] / max(c[s, 3], 1))}
                for s in range(self.S)]

    def _write_partition(self, measured: list[dict[str, float]] | None) -> None:
        """partition.json: the split, each stage's predicted time (from the profiles) next to its measured one (the
        mean forward and backward of one microbatch over the run), the profiles, and for 'auto' the DP's best plan
        with replication over the same workers."""
        predicted = self.plan.get("predicted", {}).get("stages") or [{} for _ in range(self.S)]
        stages = []
        for s, ((a, b), pred) in enumerate(zip(self.ranges, predicted, strict=True)):
            row = {"stage": s, "blocks": [a, b], "predicted_compute_s": pred.get("compute_s"),
                   "predicted_s": pred.get("predicted_s")}
            if measured is not None:
                row.update(measured_forward_s=measured[s]["forward_s"], measured_backward_s=measured[s]["backward_s"],
                           measured_compute_s=measured[s]["forward_s"] + measured[s]["backward_s"])
            stages.append(row)
        record = {"method": self.name, "stages": stages, "input_shapes": self.shapes, **self.plan}
        (self.ctx.run_dir / "partition.json").write_text(json.dumps(record, indent=1))

    def finish(self) -> None:
        if not self.virtual:
            self.executor.flush()
        measured = self._measured()
        if self.ctx.rank == 0:
            self._write_partition(measured)
