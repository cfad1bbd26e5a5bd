"""PipeDream's partitioner: contiguous block ranges and replica counts that minimise the slowest pipeline stage."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from methods.pipeline.core.block_profile import BlockProfile

# Two objective values closer than this (relatively) are a tie, so the tie rule, not float noise, picks the plan.
_TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class StagePlan:
    """Blocks [start, end) on `replicas` data-parallel workers, with the terms of PipeDream's cost model.

    compute_s: sum of forward + backward time of the blocks (the paper's sum of T_l).
    sync_s: the replicas' weight synchronisation time 4 (r-1) |w| / (B r) for the stage's parameter bytes |w|.
    predicted_s: the stage's time per minibatch, T(start -> end, r) = max(compute_s, sync_s) / r.
    transfer_s: 2 C / B for the boundary into this stage (activations forward, their gradients back), where C is the
        output activation bytes of block start - 1; 0 for the first stage.
    """

    start: int
    end: int
    replicas: int
    compute_s: float
    predicted_s: float
    sync_s: float = 0.0
    transfer_s: float = 0.0


@dataclass(frozen=True)
class PartitionPlan:
    """A pipeline of stages covering all blocks in order; slowest_s is its predicted time per minibatch."""

    stages: tuple[StagePlan, ...]
    bandwidth: float
    slowest_s: float

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """[start, end) block range of every stage, in order."""
        return [(stage.start, stage.end) for stage in self.stages]

    @property
    def replicas(self) -> list[int]:
        """Replica count of every stage, in order."""
        return [stage.replicas for stage in self.stages]

    @property
    def workers(self) -> int:
        """Workers the plan occupies: the sum of the replica counts."""
        return sum(self.replicas)

    def to_dict(self) -> dict:
        """Plain types only, for JSON."""
        return {
            "bandwidth": self.bandwidth,
            "slowest_s": self.slowest_s,
            "workers": self.workers,
            "stages": [asdict(stage) for stage in self.stages],
        }

    def __str__(self) -> str:
        return " | ".join(f"[{s.start},{s.end})x{s.replicas}" for s in self.stages) + f"  slowest {self.slowest_s:.6g}s"


def sync_time(param_bytes: float, replicas: int, bandwidth: float) -> float:
    """Weight synchronisation of a stage replicated r times: 4 (r-1) |w| / (B r) (PipeDream, section 3.1)."""
    return 4.0 * (replicas - 1) * param_bytes / (bandwidth * replicas)


def transfer_time(activation_bytes: float, bandwidth: float) -> float:
    """Crossing one stage boundary: the activation forward and its gradient back, 2 C / B."""
    return 2.0 * activation_bytes / bandwidth


def stage_time(compute_s: float, param_bytes: float, replicas: int, bandwidth: float) -> float:
    """PipeDream's T(i -> j, m) = max(sum T_l, sum W_l^m) / m: sync overlaps compute; m replicas share the load."""
    return max(compute_s, sync_time(param_bytes, replicas, bandwidth)) / replicas


#: A stage's bytes per replica: (first block, end block, replicas, stages after it) -> bytes. A stage's weight
#: versions and held microbatches depend on how many stages follow it (1F1B holds S - s), so the DP carries that count.
StageBytes = Callable[[int, int, int, int], int]


class NoPlanFits(ValueError):
    """No partition puts every stage within the memory budget."""


def pipedream_partition(
    profiles: Sequence[BlockProfile],
    workers: int,
    bandwidth: float = 1e9,
    max_stages: int | None = None,
    *,
    allow_idle_workers: bool = False,
    memory: StageBytes | None = None,
    budget: int | None = None,
) -> PartitionPlan:
    """The pipeline of contiguous stages, each replicated over some workers, with the fastest slowest stage.

    PipeDream's dynamic program (Narayanan et al., SOSP 2019, section 3.1), with blocks 0..n-1 as the layers:

        A(j, m) = min( T(0 -> j, m),
                       min_{0 <= i < j} min_{1 <= m' < m} max( A(i, m - m'), 2 C_i / B, T(i+1 -> j, m') ) )

    A(j, m) is the time of the slowest stage of the best pipeline of blocks 0..j on exactly m workers;
    T(i -> j, m) = max(sum_l T_l, 4 (m-1) sum_l |w_l| / (B m)) / m is one stage of blocks i..j replicated m times
    (see stage_time); C_i is block i's output activation bytes. The answer is A(n-1, workers): as in the paper, every
    worker is used. allow_idle_workers=True instead takes the best of A(n-1, m) over m <= workers (fewest workers
    on ties), which helps when every further replica costs more in weight sync than it saves. `max_stages` caps the
    number of stages (1 gives plain data parallelism over all workers).

    Ties (objective values within a relative 1e-9) keep the first candidate in the recurrence's order: the prefix as
    one stage, then the last cut i from earliest to latest, then the last stage's replicas m' from fewest to most.

    With `memory` and `budget`, a stage whose bytes per replica (memory(start, end, replicas, stages after it))
    exceed the budget is infeasible: the DP returns the fastest plan whose every stage fits, and raises NoPlanFits
    when none does.
    """
    _check_profiles(profiles, bandwidth)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if max_stages is not None and max_stages < 1:
        raise ValueError(f"max_stages must be >= 1 or None, got {max_stages}")
    solve = _solver(profiles, bandwidth, replicate=True, memory=memory, budget=budget)
    candidates = range(1, workers + 1) if allow_idle_workers else [workers]
    best = None
    for used in candidates:
        found = solve(len(profiles), used, max_stages, 0)
        if found is not None and (best is None or _better(found[0], best[0])):
            best = found
    if best is None:  # only under a budget: one stage on all workers is otherwise always feasible
        raise NoPlanFits(f"no partition of {len(profiles)} blocks on {workers} workers fits {budget} bytes per rank")
    return predict(profiles, [(s, e) for s, e, _ in best[1]], bandwidth, [r for _, _, r in best[1]])


def straight_partition(profiles: Sequence[BlockProfile], stages: int, bandwidth: float = 1e9,
                       memory: StageBytes | None = None, budget: int | None = None) -> PartitionPlan:
    """Exactly `stages` stages on one worker each (no replication), with the fastest slowest stage.

    The same recurrence as pipedream_partition with every m' = 1: A(j, s) = min_i max(A(i, s-1), 2 C_i / B,
    sum_{l=i+1..j} T_l). This is the split an executor runs when the world size equals the number of stages. Ties as
    in pipedream_partition: the earliest last cut wins. `memory` and `budget` as in pipedream_partition.
    """
    _check_profiles(profiles, bandwidth)
    if not 1 <= stages <= len(profiles):
        raise ValueError(f"cannot cut {len(profiles)} blocks into {stages} stages (need 1 <= stages <= blocks)")
    found = _solver(profiles, bandwidth, replicate=False, memory=memory, budget=budget)(len(profiles), stages, None, 0)
    if found is None:  # only under a budget: stages <= blocks is otherwise always feasible
        raise NoPlanFits(f"no cut of {len(profiles)} blocks into {stages} stages fits {budget} bytes per rank")
    return predict(profiles, [(s, e) for s, e, _ in found[1]], bandwidth)


def predict(
    profiles: Sequence[BlockProfile],
    ranges: Sequence[tuple[int, int]],
    bandwidth: float = 1e9,
    replicas: Sequence[int] | None = None,
) -> PartitionPlan:
    """PipeDream's cost model for a given split (e.g. a uniform or hand-made one); replicas default to one per stage.

    slowest_s is the largest stage time or boundary transfer: the objective the partitioners minimise.
    """
    _check_profiles(profiles, bandwidth)
    ranges = [(int(start), int(end)) for start, end in ranges]
    replicas = [1] * len(ranges) if replicas is None else [int(r) for r in replicas]
    if not ranges:
        raise ValueError("no stage ranges given")
    if len(replicas) != len(ranges):
        raise ValueError(f"{len(replicas)} replica counts for {len(ranges)} stages")
    stages, expected_start = [], 0
    for index, ((start, end), count) in enumerate(zip(ranges, replicas, strict=True)):
        if start != expected_start or not start < end <= len(profiles):
            raise ValueError(
                f"stage {index} is [{start}, {end}), expected a non-empty range starting at {expected_start}: "
                f"ranges must be contiguous and cover blocks 0..{len(profiles) - 1} in order"
            )
        if count < 1:
            raise ValueError(f"stage {index} has {count} replicas, need >= 1")
        expected_start = end
        compute_s = math.fsum(p.compute_s for p in profiles[start:end])
        param_bytes = sum(p.param_bytes for p in profiles[start:end])
        stages.append(
            StagePlan(
                start=start,
                end=end,
                replicas=count,
                compute_s=compute_s,
                predicted_s=stage_time(compute_s, param_bytes, count, bandwidth),
                sync_s=sync_time(param_bytes, count, bandwidth),
                transfer_s=transfer_time(profiles[start - 1].activation_bytes, bandwidth) if start > 0 else 0.0,
            )
        )
    if expected_start != len(profiles):
        raise ValueError(f"ranges end at block {expected_start}, but there are {len(profiles)} blocks")
    # the objective: each stage's time or its incoming transfer, whichever is larger
    slowest_s = max(max(stage.predicted_s, stage.transfer_s) for stage in stages)
    return PartitionPlan(stages=tuple(stages), bandwidth=bandwidth, slowest_s=slowest_s)


_Solution = tuple[float, tuple[tuple[int, int, int], ...]]  # (slowest stage time, ((start, end, replicas), ...))


def _solver(profiles: Sequence[BlockProfile], bandwidth: float, replicate: bool, memory: StageBytes | None = None,
            budget: int | None = None):
    """best(end, m, stages_left, after): the optimal pipeline of blocks [0, end) on exactly m workers, followed by
    `after` more stages, or None if none fits.

    stages_left caps the number of stages (None: no cap). Without replication every stage has one worker, so m is
    also the number of stages. Without a budget `after` is always 0 (nothing depends on it).
    """
    limited = memory is not None and budget is not None

    def fits(start: int, end: int, count: int, after: int) -> bool:
        return not limited or memory(start, end, count, after) <= budget
    compute = [0.0, *itertools.accumulate(p.compute_s for p in profiles)]
    params = [0, *itertools.accumulate(p.param_bytes for p in profiles)]

    def one_stage(start: int, end: int, count: int) -> float:
        return stage_time(compute[end] - compute[start], params[end] - params[start], count, bandwidth)

    @functools.cache
    def best(end: int, m: int, stages_left: int | None, after: int) -> _Solution | None:
        incumbent: _Solution | None = None
        if (replicate or m == 1) and fits(0, end, m, after):
            incumbent = (one_stage(0, end, m), ((0, end, m),))
        if stages_left == 1:
            return incumbent
        below = None if stages_left is None else stages_left - 1
        for cut in range(1, end):
            boundary = transfer_time(profiles[cut - 1].activation_bytes, bandwidth)
            for last in range(1, m if replicate else min(m, 2)):
                if not fits(cut, end, last, after):
                    continue
                prefix = best(cut, m - last, below, after + 1 if limited else 0)
                if prefix is None:
                    continue
                value = max(prefix[0], boundary, one_stage(cut, end, last))
                if incumbent is None or _better(value, incumbent[0]):
                    incumbent = (value, (*prefix[1], (cut, end, last)))
        return incumbent

    return best


def _better(value: float, incumbent: float) -> bool:
    """Strictly better beyond the tie tolerance."""
    return value < incumbent - _TIE_TOLERANCE * abs(incumbent)


def _check_profiles(profiles: Sequence[BlockProfile], bandwidth: float) -> None:
    if len(profiles) == 0:
        raise ValueError("no block profiles: profile the model's blocks first (profiler.profile_blocks)")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    for index, p in enumerate(profiles):
        if not all(value >= 0 for value in (p.forward_s, p.backward_s, p.activation_bytes, p.param_bytes)):
            raise ValueError(f"block {index} has a negative or NaN time or size: {p}")
