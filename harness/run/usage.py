"""How much CPU a rank got while it trained: process CPU time and run-queue wait against wall time, and the load."""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def run_queue_wait_s() -> float | None:
    """Seconds this process's threads have waited on a run queue while runnable (the second field of Linux's
    /proc/<pid>/task/<tid>/schedstat, summed over the live threads); None where the kernel does not expose it."""
    tasks = Path("/proc/self/task")
    try:
        names = os.listdir(tasks)
    except OSError:
        return None
    total = 0
    for name in names:
        try:
            total += int((tasks / name / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that just exited, or no schedstat
            continue
    return total / 1e9 if names else None


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, steal): CPU seconds the whole machine has spent busy (all but idle and iowait, steal excluded) and
    stolen by the hypervisor, summed over its cores, from /proc/stat; None where there is no /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq = (ticks + [0] * 7)[:7]
    steal = ticks[7] if len(ticks) > 7 else 0
    return (user + nice + system + irq + softirq) / hz, steal / hz


def peak_rss_bytes() -> int | None:
    """The most resident memory this process has held so far (getrusage's ru_maxrss: kB on Linux, bytes on macOS),
    in bytes; None where the resource module is missing (Windows). A rank forked from the warm server counts the
    server's pages it maps too, as the kernel does."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages (os.getloadavg), or None where there are none."""
    try:
        return [round(v, 3) for v in os.getloadavg()]
    except OSError:
        return None


@dataclass(frozen=True)
class UsageSample:
    """One reading: wall clock, this process's CPU time (all threads), its run-queue wait, and the load."""

    wall_s: float
    cpu_s: float
    wait_s: float | None
    load: list[float] | None
    machine: tuple[float, float] | None

    @classmethod
    def now(cls) -> UsageSample:
        return cls(time.perf_counter(), time.process_time(), run_queue_wait_s(), load_average(), machine_cpu_s())


def usage_record(start: UsageSample, end: UsageSample, threads: int) -> dict[str, Any]:
    """The fields of a rank's `cpu` record over [start, end]: wall_s, cpu_s (this process, all threads), wait_s
    (run-queue wait of its threads; None without schedstat), threads (the rank's intra-op threads), host, cores,
    load_start and load_end (1, 5, 15 min), machine_busy_s and machine_steal_s (the whole machine; None without
    /proc/stat), peak_rss_bytes (the rank's peak resident memory, peak_rss_bytes()).

    The report judges these (harness/report/hygiene.py): a rank is starved when it ran less than 0.8 of the time it
    was runnable, and a run is noisy when a rank was starved while other processes used the machine.
    """
    wait = None if start.wait_s is None or end.wait_s is None else round(end.wait_s - start.wait_s, 6)
    busy = steal = None
    if start.machine is not None and end.machine is not None:
        busy = round(end.machine[0] - start.machine[0], 3)
        steal = round(end.machine[1] - start.machine[1], 3)
    return {"wall_s": round(end.wall_s - start.wall_s, 6), "cpu_s": round(end.cpu_s - start.cpu_s, 6),
            "wait_s": wait, "threads": threads, "host": socket.gethostname(), "cores": os.cpu_count(),
            "load_start": start.load, "load_end": end.load, "machine_busy_s": busy, "machine_steal_s": steal,
            "peak_rss_bytes": peak_rss_bytes()}
