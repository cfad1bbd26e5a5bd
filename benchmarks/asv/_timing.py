"""Timing helpers for benchmarks that measure a subject and its peer side by side and report the ratio."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def calls_per_block(fn: Callable[[], object], min_seconds: float) -> int:
    """How many calls of `fn` make a block of at least `min_seconds` (doubling from 1; calls fn while counting)."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - start >= min_seconds or number >= 1 << 20:
            return number
        number *= 2


def per_call_seconds(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of `fn` over one block of `number` calls."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def interleaved_ratio(subject: Callable[[], object], peer: Callable[[], object], rounds: int = 5,
                      min_seconds: float = 0.02) -> float:
    """Median over `rounds` of (subject's seconds per call) / (peer's), measured in alternating blocks.

    Alternating blocks (subject, peer, peer, subject, ...) let machine noise hit both alike; each block runs at
    least `min_seconds`, and both are called once before timing starts.
    """
    subject_number = calls_per_block(subject, min_seconds)
    peer_number = calls_per_block(peer, min_seconds)
    ratios = []
    for index in range(rounds):
        if index % 2 == 0:
            subject_s = per_call_seconds(subject, subject_number)
            peer_s = per_call_seconds(peer, peer_number)
        else:
            peer_s = per_call_seconds(peer, peer_number)
            subject_s = per_call_seconds(subject, subject_number)
        ratios.append(subject_s / peer_s)
    return statistics.median(ratios)
