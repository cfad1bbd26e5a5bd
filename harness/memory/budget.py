"""The budget check (`memory_per_rank`): the one-line refusal, and DoesNotFit for a planner that finds no plan."""

from __future__ import annotations

from collections.abc import Mapping

from harness.bytesize import format_bytes
from harness.memory.kinds import MemoryBytes


def refusal(plans: Mapping[int, MemoryBytes], budget: int) -> str | None:
    """None when every rank's plan fits `budget` bytes, else one line naming the rank that needs the most."""
    rank, plan = max(plans.items(), key=lambda item: (item[1].total, -item[0]))
    if plan.total <= budget:
        return None
    return (f"does not fit: rank {rank} needs {format_bytes(plan.total)} > memory_per_rank {format_bytes(budget)} "
            f"({plan.describe()})")


class DoesNotFit(Exception):
    """A run that cannot be placed in its memory_per_rank: raised before the first step (a planner that finds no
    plan that fits), reported as the run's state `does_not_fit` with this one line, not as a crash."""
