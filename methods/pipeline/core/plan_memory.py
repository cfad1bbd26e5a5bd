"""The planners' memory: a contiguous stage's bytes under a StageCost (what PipeDream's DP checks against the
budget), each candidate shape's verdict, and what partition.json says about them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from harness.bytesize import format_bytes
from harness.memory import DoesNotFit, Footprint, chain_saved_bytes
from methods.pipeline.core.block_profile import BlockProfile
from methods.pipeline.core.memory import StageCost
from methods.pipeline.core.partitioner import PartitionPlan, pipedream_partition, predict, straight_partition


class ChainMemory:
    """Bytes per replica of blocks [start, end) as a stage with `after` stages after it (partitioner.StageBytes):
    the blocks' parameters, their saved activations on a microbatch (the loss's too on the last stage, `prints`
    profiling every block and then the loss), priced by `cost`."""

    def __init__(self, cost: StageCost, prints: Sequence[Footprint], profiles: Sequence[BlockProfile]):
        self.cost, self.prints = cost, list(prints)
        self.params = [0]
        for profile in profiles:
            self.params.append(self.params[-1] + profile.param_bytes)

    def __call__(self, start: int, end: int, replicas: int, after: int) -> int:
        last = after == 0
        saved = chain_saved_bytes(self.prints, start, end + 1 if last else end)
        return self.cost.bytes(self.params[end] - self.params[start], saved, replicas, after, start == 0 and last)

    def of(self, ranges: Sequence[tuple[int, int]], replicas: Sequence[int]) -> list[int]:
        """Each stage's bytes per replica in a plan."""
        count = len(ranges)
        return [self(a, b, r, count - 1 - i) for i, ((a, b), r) in enumerate(zip(ranges, replicas, strict=True))]


def shape_text(ranges: Sequence[tuple[int, int]], replicas: Sequence[int]) -> str:
    """'data parallel x2' or '2 stages [0,3)x1 [3,6)x1'."""
    if len(ranges) == 1:
        return f"data parallel x{replicas[0]}" if replicas[0] > 1 else "one stage"
    return f"{len(ranges)} stages " + " ".join(f"[{a},{b})x{r}" for (a, b), r in zip(ranges, replicas, strict=True))


def verdict(stage_bytes: Sequence[int], budget: int | None, is_chosen: bool, slowest_s: float,
            chosen_s: float | None, per: str = "") -> str:
    """Why a candidate plan was or was not taken: 'chosen'; over the budget (its largest stage, how much); or
    fitting but no faster than the chosen plan (`chosen_s`, its time; `per` what the times are per)."""
    worst = max(range(len(stage_bytes)), key=stage_bytes.__getitem__)
    if is_chosen:
        return "chosen"
    if budget is not None and stage_bytes[worst] > budget:
        return (f"does not fit: stage {worst} needs {format_bytes(stage_bytes[worst])} > memory_per_rank "
                f"{format_bytes(budget)}")
    if chosen_s is not None:
        return f"fits, not faster: {slowest_s:.6g} s >= {chosen_s:.6g} s{per}"
    return "fits"


def verdicts(candidates: Sequence[PartitionPlan], chosen: PartitionPlan | None, memory: ChainMemory,
             budget: int | None) -> list[dict[str, Any]]:
    """Each candidate shape (the fastest plan of each stage count, budget aside) with its stages' bytes and its
    verdict."""
    rows = []
    for plan in candidates:
        stage_bytes = memory.of(plan.ranges, plan.replicas)
        same = chosen is not None and plan.ranges == chosen.ranges and plan.replicas == chosen.replicas
        why = verdict(stage_bytes, budget, same, plan.slowest_s, chosen.slowest_s if chosen else None,
                      " per minibatch")
        rows.append({"shape": shape_text(plan.ranges, plan.replicas), "ranges": [list(r) for r in plan.ranges],
                     "replicas": plan.replicas, "predicted_s": plan.slowest_s, "stage_bytes": stage_bytes,
                     "verdict": why})
    return rows


def smallest(memory: ChainMemory, blocks: int, counts: Sequence[int]) -> list[dict[str, Any]]:
    """For each stage count, the cut of one rank per stage whose largest stage needs the fewest bytes (a DP over
    the last cut, as the partitioner's, minimising memory instead of time): what a refusal names."""

    @functools.cache
    def best(end: int, count: int, after: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        if count == 1:
            return memory(0, end, 1, after), ((0, end),)
        found = None
        for cut in range(count - 1, end):
            need, ranges = best(cut, count - 1, after + 1)
            option = (max(need, memory(cut, end, 1, after)), (*ranges, (cut, end)))
            if found is None or option[0] < found[0]:
                found = option
        assert found is not None
        return found

    rows = []
    for count in counts:
        if 1 <= count <= blocks:
            ranges = best(blocks, count, 0)[1]
            rows.append({"shape": shape_text(ranges, [1] * count), "stage_bytes": memory.of(ranges, [1] * count)})
    return rows


def nothing_fits(rows: Sequence[dict[str, Any]], budget: int) -> DoesNotFit:
    """The one line of a run no plan fits: what the smallest candidate needs."""
    smallest = min(rows, key=lambda row: max(row["stage_bytes"]))
    need = max(smallest["stage_bytes"])
    return DoesNotFit(f"does not fit: no plan fits memory_per_rank {format_bytes(budget)}; the smallest, "
                      f"{smallest['shape']}, needs {format_bytes(need)} (stage "
                      f"{smallest['stage_bytes'].index(need)})")


def record(memory: ChainMemory, ranges: Sequence[tuple[int, int]], replicas: Sequence[int], budget: int | None,
           rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """partition.json's `memory`: the budget, each stage's planned bytes per replica (the planner's price), the
    microbatches each holds, and the candidate shapes with their verdicts."""
    count = len(ranges)
    return {"memory_per_rank": budget, "stage_bytes": memory.of(ranges, replicas),
            "held_microbatches": [memory.cost.held(r, count - 1 - i) for i, r in enumerate(replicas)],
            "candidates": list(rows)}


def candidates(profiles: Sequence[BlockProfile], workers: int, bandwidth: float, max_stages: int,
               replicate: bool) -> list[PartitionPlan]:
    """The fastest plan of each stage count from 1 (data parallel over every worker, when replicating) to
    max_stages, the budget aside."""
    out = []
    for count in range(1, max_stages + 1):
        plan = None
        if replicate and count == 1:
            plan = predict(profiles, [(0, len(profiles))], bandwidth, [workers])
        elif replicate:
            plan = pipedream_partition(profiles, workers, bandwidth, max_stages=count)
            if len(plan.ranges) != count:  # the DP prefers fewer stages: the fastest with one rank per stage
                plan = straight_partition(profiles, count, bandwidth) if count == workers else None
        elif count == max_stages:
            plan = straight_partition(profiles, count, bandwidth)
        if plan is not None:
            out.append(plan)
    return out
