"""The runner's memory gate: every rank's planned bytes gathered before the first step, the refusal under
`memory_per_rank`, and the plan beside the measured held bytes and the allocator's peak at the end of the run."""

from __future__ import annotations

from typing import Any

import torch

from harness.comm.communicator import Communicator
from harness.memory import KINDS, MemoryBytes


def gather(mine: dict[int, MemoryBytes] | None, comm: Communicator, device: torch.device
           ) -> dict[int, MemoryBytes] | None:
    """Every rank's bytes (each process gives its own rank's; a single process may give several emulated ranks);
    None when some rank has none. Collective when the world is larger than one (category `control`)."""
    if comm.world_size == 1:
        return dict(mine) if mine else None
    row = torch.zeros(1 + len(KINDS), dtype=torch.int64)
    if mine and comm.rank in mine:
        row[0] = 1
        row[1:] = mine[comm.rank].to_tensor()
    rows = [r.cpu() for r in comm.all_gather(row.to(device), "control")]
    if any(int(r[0]) == 0 for r in rows):
        return None
    return {rank: MemoryBytes.from_tensor(r[1:]) for rank, r in enumerate(rows)}


def gather_peaks(mine: int | None, comm: Communicator, device: torch.device) -> dict[int, int] | None:
    """Every rank's allocator peak (harness/memory/peak.py); None when some rank has none. Collective when the
    world is larger than one (category `control`)."""
    if comm.world_size == 1:
        return None if mine is None else {comm.rank: mine}
    row = torch.tensor([-1 if mine is None else mine], dtype=torch.int64)
    values = [int(r.cpu()[0]) for r in comm.all_gather(row.to(device), "control")]
    return None if min(values) < 0 else dict(enumerate(values))


def peak(per_rank: dict[int, MemoryBytes] | None) -> int | None:
    """The largest rank's total."""
    return max(m.total for m in per_rank.values()) if per_rank else None


def record(per_rank: dict[int, MemoryBytes] | None) -> dict[str, Any] | None:
    """{rank: {kind: bytes, total}} for metrics.jsonl (string keys: JSON)."""
    return {str(rank): m.as_dict() for rank, m in sorted(per_rank.items())} if per_rank else None
