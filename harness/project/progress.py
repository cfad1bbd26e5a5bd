"""Progress of `dtbench project`'s long phases, for people: a tqdm bar on a terminal, else one line per phase."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def phase(items: Iterable[T], what: str, unit: str) -> Iterator[T]:
    """`items`, one by one, while stderr shows what is being done: a bar (`what`, counted in `unit`) when stderr is
    a terminal, else the line 'dtbench project: WHAT (N UNITs)' as the phase starts; nothing when there are no
    items."""
    items = list(items)
    if not items:
        return
    if not sys.stderr.isatty():
        print(f"dtbench project: {what} ({len(items)} {unit}{'' if len(items) == 1 else 's'})", file=sys.stderr,
              flush=True)
        yield from items
        return
    yield from tqdm(items, desc=what, unit=unit, leave=False, file=sys.stderr, mininterval=0.5)
