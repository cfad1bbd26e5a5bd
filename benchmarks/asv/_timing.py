"""Timing helpers for benchmarks that measure a subject and its peer side by side and report the ratio."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def calls_per_block(fn: Callable[[], object], min_seconds: float, timer: Callable[[], float] = time.perf_counter
                    ) -> int:
    """How many calls of `fn` make a block of at least `min_seconds` of `timer` (doubling from 1; calls fn while
    counting)."""
    number = 1
    while True:
        start = timer()
        for _ in range(number):
            fn()
        if timer() - start >= min_seconds or number >= 1 << 20:
            return number
        number *= 2


def per_call_seconds(fn: Callable[[], object], number: int, timer: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of `timer` per call of `fn` over one block of `number` calls."""
    start = timer()
    for _ in range(number):
        fn()
    return (timer() - start) / number


def interleaved_ratio(subject: Callable[[], object], peer: Callable[[], object], rounds: int = 5,
                      min_seconds: float = 0.02, timer: Callable[[], float] = time.perf_counter) -> float:
    """Median over `rounds` of (subject's seconds per call) / (peer's), measured in alternating blocks.

    Alternating blocks (subject, peer, peer, subject, ...) let machine noise hit both alike; each block runs at
    least `min_seconds`, and both are called once before timing starts. `timer`: wall time by default;
    time.thread_time for single-threaded work that other processes' preemptions should not reach.
    """
    subject_number = calls_per_block(subject, min_seconds, timer)
    peer_number = calls_per_block(peer, min_seconds, timer)
    ratios = []
    for index in range(rounds):
        if index % 2 == 0:
            subject_s = per_call_seconds(subject, subject_number, timer)
            peer_s = per_call_seconds(peer, peer_number, timer)
        else:
            peer_s = per_call_seconds(peer, peer_number, timer)
            subject_s = per_call_seconds(subject, subject_number, timer)
        ratios.append(subject_s / peer_s)
    return statistics.median(ratios)
