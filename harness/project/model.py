"""What every projection returns: a step's parts, its bubble, and the notes that qualify it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.project.dataparallel import StepParts


@dataclass
class Projected:
    """A projected step (parts sum to step_s) with the pipeline bubble fraction (NaN for data parallel) and notes
    (extrapolations, assumptions, why there is no projection)."""

    parts: StepParts
    bubble: float = math.nan
    notes: list[str] = field(default_factory=list)

    @classmethod
    def missing(cls, why: str) -> Projected:
        """No projection, with the reason."""
        nan = math.nan
        return cls(StepParts(nan, nan, nan, nan, nan, nan, nan), notes=[why])


def weighted(parts: list[tuple[StepParts, float]]) -> StepParts:
    """The weighted mean of steps (weights summing to 1), field by field: a run whose payload changes over its
    steps (DGC's warm-up) projects to the mean of its steps."""
    names = StepParts.__dataclass_fields__
    return StepParts(**{name: sum(getattr(p, name) * w for p, w in parts) for name in names})
