"""The regression check's canary: a fixed pure-Python workload that DTBENCH_BENCH_SLOWDOWN makes slower on purpose.

DTBENCH_BENCH_SLOWDOWN=1.5 runs 1.5 times the loop iterations, so this benchmark (and nothing else: no production
code reads the variable) reports about 1.5 times the time, and `nox -s bench -- --compare REV` must flag it.

Two forms. `time_fixture_loop` is an ordinary time benchmark, as noisy as the machine: on a shared VM the same loop
takes 10 to 19 ms from one second to the next (host contention shows up in CPU time too). `track_fixture_vs_reference`
divides the loop's CPU time by that of the same loop at the normal size, in alternating blocks in one process, so
the machine's speed cancels and only the slowdown remains: about 1.0 normally, about F under DTBENCH_BENCH_SLOWDOWN=F.
"""

from __future__ import annotations

import os
import time

from ._timing import interleaved_ratio

ITERATIONS = 200_000


def slowdown() -> float:
    """The factor from DTBENCH_BENCH_SLOWDOWN (1 when unset or empty); anything but a number >= 1 is an error."""
    text = os.environ.get("DTBENCH_BENCH_SLOWDOWN", "").strip() or "1"
    try:
        factor = float(text)
    except ValueError:
        factor = float("nan")
    if not factor >= 1:
        raise ValueError(f"DTBENCH_BENCH_SLOWDOWN={text!r}: expected a number >= 1, e.g. 1.5")
    return factor


def sum_of_squares(iterations: int) -> int:
    total = 0
    for value in range(iterations):
        total += value * value
    return total


class Fixture:
    """Sum of squares of the first ITERATIONS (times the slowdown) integers, in pure Python."""

    timer = time.process_time  # CPU time of this process: other processes' work moves it less than wall time

    def setup(self) -> None:
        self.iterations = round(ITERATIONS * slowdown())

    def time_fixture_loop(self) -> int:
        return sum_of_squares(self.iterations)

    def track_fixture_vs_reference(self) -> float:
        """The loop's CPU seconds / the unslowed loop's, median of 15 alternating blocks. CPU time of this thread,
        not wall time: where other processes share the cores (the tests' two workers, a loaded CI machine), a
        block's wall time includes its waits to be scheduled, which had pulled the ratio of a 1.5x slowdown to 1.24
        with ranks of the other test worker running beside it."""
        return interleaved_ratio(lambda: sum_of_squares(self.iterations), lambda: sum_of_squares(ITERATIONS),
                                 rounds=15, min_seconds=0.03, timer=time.thread_time)

    track_fixture_vs_reference.unit = "x reference"
