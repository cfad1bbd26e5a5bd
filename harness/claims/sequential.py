"""Seeds until decided: a group-sequential design's looks, and the error each look may spend (Bonferroni)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.report.paired import ALPHA

#: Fewer paired seeds than this make a claim INCONCLUSIVE, whatever the interval says: the first look's size.
MIN_SEEDS = 3


def looks_up_to(max_seeds: int, first: int = MIN_SEEDS) -> tuple[int, ...]:
    """The seeds at each look, doubling from `first` and ending at `max_seeds`: 10 -> (3, 6, 10), 5 -> (3, 5),
    20 -> (3, 6, 12, 20), 3 -> (3,). Few looks keep each one's share of the error large (Design)."""
    if max_seeds < first:
        raise ValueError(f"max_seeds must be at least {first}, not {max_seeds}")
    looks = [first]
    while looks[-1] * 2 < max_seeds:
        looks.append(looks[-1] * 2)
    if looks[-1] != max_seeds:
        looks.append(max_seeds)
    return tuple(looks)


@dataclass(frozen=True)
class Design:
    """When a claim is judged: at each look, on the pairs of its first `looks[k]` seeds (in seed order), with
    `alpha / len(looks)` on each side. A claim's verdict is that of the first look that decides it (PASS or FAIL);
    it is INCONCLUSIVE when none does. By Bonferroni's inequality the chance of a wrong PASS (or FAIL) over every
    look is at most the sum of the looks' shares, `alpha`, however the looks depend on each other: the looks do not
    inflate the error (docs/claims.md simulates it). One look at every pair is the plain, fixed-n verdict."""

    looks: tuple[int, ...]
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        if not self.looks or any(b <= a for a, b in zip(self.looks, self.looks[1:], strict=False)):
            raise ValueError(f"looks must be increasing seed counts, not {self.looks}")

    @property
    def alpha_per_look(self) -> float:
        return self.alpha / len(self.looks)

    @property
    def max_seeds(self) -> int:
        return self.looks[-1]

    def next_look(self, seeds: int) -> int | None:
        """The seeds the next look needs, with `seeds` judged already; None past the last look."""
        return next((n for n in self.looks if n > seeds), None)
