"""The plan of a pipeline run: stage ranges and replicas (chosen, uniform, or PipeDream's DP), agreed by all ranks,
and partition.json with the predicted and measured stage times."""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.memory import DoesNotFit
from harness.split import uniform_split
from methods.pipeline.core import block_profile as profiler
from methods.pipeline.core import partitioner, plan_memory


@dataclass
class StageTimes:
    """One stage's measured compute over a run (summed over its replicas): seconds and counts of forwards and
    backwards."""

    forward_s: float = 0.0
    forwards: int = 0
    backward_s: float = 0.0
    backwards: int = 0

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(astuple(self), dtype=torch.float64)

    @classmethod
    def from_tensor(cls, row: torch.Tensor) -> StageTimes:
        return cls(float(row[0]), int(row[1]), float(row[2]), int(row[3]))


@dataclass
class Plan:
    """ranges[s] = [start, end) blocks of stage s; replicas[s] its replica count; record: what partition.json shows
    (mode, bandwidth, the profiles, PipeDream's predicted stage times, and for 'auto' the DP's best plan)."""

    ranges: list[tuple[int, int]]
    replicas: list[int]
    record: dict[str, Any]


def make_plan(blocks: list[nn.Module], example: torch.Tensor, partition: str | list[int], stages: int | None,
              replicas: list[int] | None, workers: int, bandwidth: float, comm: Communicator,
              auto_replicas: bool = False, memory: plan_memory.ChainMemory | None = None,
              budget: int | None = None) -> Plan:
    """The stage ranges and replicas, the same on every rank (collective when comm.world_size > 1).

    Rank 0 profiles every block on `example` (a microbatch), so every split, chosen or solved, comes with PipeDream's
    predicted stage times. `partition`: a list of the first block of every stage after the first; 'uniform' (equal
    block counts); or 'auto': PipeDream's DP for `stages` stages on one rank each, or, with `auto_replicas`, over all
    `workers` with replication (the DP picks the stage count too, at most `stages` when given). `replicas` (per stage)
    is used as given. Rank 0 broadcasts its answer (category `control`).

    With `memory` (the planners' price of a candidate stage, plan_memory.ChainMemory), record['memory'] gives each
    stage's planned bytes and, for 'auto', the fastest plan of each stage count with its verdict; under `budget`
    (memory_per_rank) 'auto' chooses the fastest plan whose every stage fits, and when none does every rank raises
    DoesNotFit with what the smallest candidate needs.
    """
    n = len(blocks)
    agreed = torch.zeros(2 * n + 2, dtype=torch.int64)  # [S, b_0..b_S, r_0..r_{S-1}]
    record: dict[str, Any] = {"mode": partition if isinstance(partition, str) else "manual", "bandwidth": bandwidth}
    refused: DoesNotFit | None = None
    if comm.rank == 0:
        profiles = profiler.profile_blocks(blocks, example)
        limit = {"memory": memory, "budget": budget} if memory is not None and budget is not None else {}
        shapes: list = []
        if memory is not None and partition == "auto":
            most = (stages or min(workers, n)) if auto_replicas else (stages or len(replicas or [1]))
            shapes = plan_memory.candidates(profiles, workers, bandwidth, most, auto_replicas)
        chosen = list(replicas) if replicas else None
        if isinstance(partition, list):
            if partition[-1] >= n:
                raise ValueError(f"partition {partition}: the model has only {n} blocks")
            ranges = list(zip([0, *partition], [*partition, n], strict=True))
        elif partition == "uniform":
            ranges = uniform_split(n, stages or len(chosen))
        else:
            try:
                if auto_replicas:  # PipeDream's plan over every worker, replication included
                    best = partitioner.pipedream_partition(profiles, workers, bandwidth, max_stages=stages, **limit)
                    record["best_with_replication"] = best.to_dict()
                    ranges, chosen = best.ranges, best.replicas
                else:
                    count = stages or len(chosen)
                    ranges = partitioner.straight_partition(profiles, count, bandwidth, **limit).ranges
                    best = partitioner.pipedream_partition(profiles, max(workers, count), bandwidth)
                    record["best_with_replication"] = best.to_dict()
            except partitioner.NoPlanFits:
                counts = range(1, (stages or min(workers, n)) + 1) if auto_replicas else [stages or len(chosen)]
                rows = [*plan_memory.verdicts(shapes, None, memory, budget), *plan_memory.smallest(memory, n, counts)]
                refused = plan_memory.nothing_fits(rows, budget)
        if refused is None:
            chosen = chosen or [1] * len(ranges)
            if len(chosen) != len(ranges):
                raise ValueError(f"replicas {chosen} name {len(chosen)} stages; the split has {len(ranges)}")
            predicted = partitioner.predict(profiles, ranges, bandwidth, chosen)
            record["predicted"] = predicted.to_dict()
            record["profiles"] = profiler.profiles_to_dicts(profiles)
            if memory is not None:
                rows = plan_memory.verdicts(shapes, predicted, memory, budget)
                record["memory"] = plan_memory.record(memory, ranges, chosen, budget, rows)
            s = len(ranges)
            agreed[0] = s
            agreed[1:s + 2] = torch.tensor([a for a, _ in ranges] + [n])
            agreed[s + 2:2 * s + 2] = torch.tensor(chosen)
    if comm.world_size > 1:
        comm.broadcast(agreed, 0, "control")
    s = int(agreed[0])
    if s == 0:  # rank 0 found no plan that fits: every rank stops, before any stage is built
        raise refused or DoesNotFit("does not fit: rank 0's planner found no plan within memory_per_rank")
    bounds = agreed[1:s + 2].tolist()
    return Plan([(bounds[i], bounds[i + 1]) for i in range(s)], agreed[s + 2:2 * s + 2].tolist(), record)


def write_partition(path: Path, method: str, plan: Plan, stage_ranks: list[list[int]],
                    shapes: list[tuple[int, ...]], measured: list[StageTimes] | None) -> None:
    """partition.json: the split and its replicas (ranks), each stage's predicted time (from the profiles) next to
    its measured one (the mean forward and backward of one microbatch over the run), the profiles, and for 'auto' the
    DP's best plan with replication over the same workers."""
    predicted = plan.record.get("predicted", {}).get("stages") or [{} for _ in plan.ranges]
    stages = []
    for s, ((a, b), pred) in enumerate(zip(plan.ranges, predicted, strict=True)):
        row = {"stage": s, "blocks": [a, b], "replicas": plan.replicas[s], "ranks": stage_ranks[s],
               "predicted_compute_s": pred.get("compute_s"), "predicted_s": pred.get("predicted_s")}
        if measured is not None:
            times = measured[s]
            forward, backward = times.forward_s / max(times.forwards, 1), times.backward_s / max(times.backwards, 1)
            row.update(measured_forward_s=forward, measured_backward_s=backward,
                       measured_compute_s=forward + backward)
        stages.append(row)
    record = {"method": method, "stages": stages, "input_shapes": shapes, **plan.record}
    path.write_text(json.dumps(record, indent=1))
