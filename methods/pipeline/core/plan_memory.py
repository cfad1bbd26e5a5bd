"""The planners' memory: a contiguous stage's bytes, its terms walked as the runner walks its plan (what PipeDream's
DP checks against the budget), each candidate shape's verdict, and what partition.json says about them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from harness.bytesize import format_bytes
from harness.memory import DoesNotFit
from methods.pipeline.core.block_profile import BlockProfile
from methods.pipeline.core.memory import StageWalk
from methods.pipeline.core.partitioner import PartitionPlan, pipedream_partition, predict, straight_partition
from methods.pipeline.core.step_bytes import StageTerms

#: A candidate stage's terms: (first block, end block, stages after it, microbatches it holds) -> StageTerms.
ChainTerms = Callable[[int, int, int, int], StageTerms]


class ChainMemory:
    """Bytes per replica of blocks [start, end) as a stage with `after` stages after it (partitioner.StageBytes):
    `terms` (core/memory.py's stage_terms, as the runner prices its stages) walked by `walk` over the method's
    steady-state steps (StageWalk: the runner's own walk), each price computed once."""

    def __init__(self, walk: StageWalk, terms: ChainTerms):
        self.walk, self.terms = walk, terms
        self._prices: dict[tuple[int, int, int, int], int] = {}

    def __call__(self, start: int, end: int, replicas: int, after: int) -> int:
        key = (start, end, replicas, after)
        if key not in self._prices:
            terms = self.terms(start, end, after, self.walk.held(replicas, after))
            self._prices[key] = self.walk.bytes(terms, replicas, after).total
        return self._prices[key]

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
            "held_microbatches": [memory.walk.held(r, count - 1 - i) for i, r in enumerate(replicas)],
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
