"""A run's plan against the allocator, rank by rank: the plan's total, the allocator's peak and their ratio."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.results import read_json, read_jsonl

#: The plan is judged good when it is at least the allocator's peak and at most this many times it (issue 52).
MAX_RATIO = 1.10

#: The CPU meter's resolution: a tensor freed on a thread the profiler does not watch (gloo's worker thread lets a
#: collective's tensors go when its work completes after Python has dropped it) stays counted as held. Its known
#: causes were fixed (a pipeline stage's saved-tensor cells, the plan's gather across ranks, the comm hooks'
#: payloads); what remains are the runtime's own control tensors, measured at 4 to 60 bytes in about one run in
#: ten (DDP's bucket indices at its second step, a pipeline's small messages; docs/memory.md). A plan within this
#: many bytes below the peak counts as at least it. CUDA's counter has no such blind spot, and this is below its
#: 512-byte allocation granularity.
METER_SLACK_BYTES = 256


@dataclass(frozen=True)
class RankCheck:
    """One rank of one run: its planned bytes by kind (the total among them), its allocator peak."""

    run: str
    method: str
    workload: str
    rank: int
    planned: dict[str, int]
    peak: int

    @property
    def ratio(self) -> float:
        return self.planned["total"] / self.peak if self.peak > 0 else float("inf")

    @property
    def ok(self) -> bool:
        return self.peak - METER_SLACK_BYTES <= self.planned["total"] <= MAX_RATIO * self.peak


def rank_checks(run_dir: str | Path) -> list[RankCheck]:
    """Every rank of a completed run that recorded both its plan and its allocator peak; [] for one that did not
    (a method without a plan, a run that trained no step)."""
    run_dir = Path(run_dir)
    spec = read_json(run_dir / "spec.json") or {}
    planned = allocator = None
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        if record.get("kind") == "memory" and record.get("when") == "planned":
            planned = record.get("per_rank")
        elif record.get("kind") == "memory" and record.get("when") == "allocator":
            allocator = record.get("per_rank")
    if not planned or not allocator:
        return []
    return [RankCheck(run_dir.name, str(spec.get("method")), str(spec.get("workload")), int(rank),
                      {k: int(v) for k, v in planned[rank].items()}, int(allocator[rank]))
            for rank in sorted(planned, key=int) if rank in allocator]
