"""The host a run's ranks shared: when they compute on more threads at once than it has cores, each gets a share
(processor sharing), which a held-out run on a small machine measures and a projection to one rank per node does
not have."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from harness.schedule.ir import COMPUTE

if TYPE_CHECKING:
    from harness.project.simulate import Span, Task

#: Rounds of the fixed point between a simulated step and the sharing it implies.
ROUNDS = 6


@dataclass(frozen=True)
class Host:
    """cores: the host's CPUs (inf: a rank never waits for a core, as on one rank per node); ranks: how many of the
    run's ranks it held; threads: each rank's compute threads."""

    cores: float = math.inf
    ranks: int = 1
    threads: int = 1

    @property
    def oversubscribed(self) -> bool:
        return self.ranks * self.threads > self.cores

    def all_at_once(self) -> float:
        """The slow-down of compute when every rank computes at once (data parallel): max(1, ranks x threads /
        cores)."""
        return max(1.0, self.ranks * self.threads / self.cores)


DEDICATED = Host()


def host_of(spec: dict[str, Any], manifest: dict[str, Any] | None) -> Host:
    """The host a run's ranks shared, from its manifest (cpu_count, threads per rank) and spec (world size, nodes):
    DEDICATED when the manifest does not say."""
    manifest = manifest or {}
    cores = manifest.get("cpu_count")
    per_rank = (manifest.get("threads") or {}).get("per_rank")
    if not isinstance(cores, int) or cores < 1:
        return DEDICATED
    threads = max(per_rank) if isinstance(per_rank, list) and per_rank else per_rank
    nodes = int(spec.get("nodes") or 1)
    ranks = math.ceil(int(spec.get("world_size") or 1) / max(1, nodes))
    return Host(float(cores), ranks, int(threads) if isinstance(threads, int) and threads > 0 else 1)


def sharing(spans: Sequence[Sequence[Span]], host: Host, steps: set[int]) -> float:
    """The mean slow-down the compute spans of `steps` would get from sharing the host's cores: over each compute
    span, the time-average of max(1, threads computing / cores), weighted by the spans' lengths. A rank's lanes
    split its threads (each lane computes on threads / lanes, at least 1)."""
    lanes = [max(1, len({s.task.lane for s in rank})) for rank in spans]
    edges: list[tuple[float, float]] = []  # (time, change of threads computing)
    work = []
    for r, rank in enumerate(spans):
        demand = max(1.0, host.threads / lanes[r])
        for s in rank:
            if s.task.op in COMPUTE and s.end > s.start:
                edges += [(s.start, demand), (s.end, -demand)]
                if s.task.step in steps:
                    work.append((s.start, s.end))
    if not work:
        return 1.0
    edges.sort()
    times = [t for t, _ in edges]
    level, levels = 0.0, []
    for _, change in edges:
        level += change
        levels.append(level)

    def slowdown(start: float, end: float) -> float:
        total, t = 0.0, start
        i = bisect.bisect_right(times, start) - 1
        while t < end:
            nxt = times[i + 1] if i + 1 < len(times) else end
            upto = min(end, nxt)
            active = levels[i] if i >= 0 else 0.0
            total += (upto - t) * max(1.0, active / host.cores)
            t, i = upto, i + 1
        return total

    return sum(slowdown(a, b) for a, b in work) / sum(b - a for a, b in work)


def shared_run(tasks: list[list[Task]], host: Host, run: Callable[[list[list[Task]]], list[list[Span]]],
               steps: set[int]) -> tuple[list[list[Span]], float]:
    """Simulate `tasks` on a host whose cores the ranks share: compute durations times a factor k, with k the
    sharing that the simulated step with k implies (a fixed point, found in ROUNDS rounds from k = 1). Returns the
    spans and k; with a host that fits every thread, the plain simulation and 1."""
    spans = run(tasks)
    if not host.oversubscribed:
        return spans, 1.0
    factor = 1.0
    for _ in range(ROUNDS):
        factor = sharing(spans, host, steps)
        spans = run(scaled(tasks, factor))
    return spans, factor


def scaled(tasks: list[list[Task]], factor: float) -> list[list[Task]]:
    """The tasks with every compute duration times `factor`."""
    return [[replace(t, duration_s=t.duration_s * factor) if t.op in COMPUTE else t for t in rank]
            for rank in tasks]
