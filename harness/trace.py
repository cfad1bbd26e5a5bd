"""The trace format of pipeline runs (part of the results contract) and the bubble arithmetic over it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

#: Actions that occupy a stage's compute; the others are waits (receives) or hand-overs (sends).
COMPUTE_OPS = ("forward", "backward", "update")
WAIT_OPS = ("recv_act", "recv_grad")


class TraceEvent(NamedTuple):
    """One action a stage ran. In metrics.jsonl a `trace` record holds `events`, a list of these as JSON arrays
    (field order as here), with `step` and `stage`.

    op: forward, backward, update, recv_act, send_act, recv_grad or send_grad.
    mb: the microbatch (or minibatch) id; -1 for an update.
    start, end: time.perf_counter() readings, comparable across the processes of one host.
    version: the weight version a forward or backward used; -1 for other actions.
    """

    op: str
    mb: int
    start: float
    end: float
    version: int = -1

    @property
    def duration(self) -> float:
        return self.end - self.start


def parse_events(rows: Any) -> list[TraceEvent]:
    """A trace record's `events` -> TraceEvents; rows that are not [op, mb, start, end, version?] are skipped, so a
    damaged record loses only its bad rows."""
    events = []
    if not isinstance(rows, list):
        return events
    for row in rows:
        if not isinstance(row, (list, tuple)) or len(row) < 4:
            continue
        try:
            version = int(row[4]) if len(row) > 4 else -1
            events.append(TraceEvent(str(row[0]), int(row[1]), float(row[2]), float(row[3]), version))
        except (TypeError, ValueError):
            continue
    return events


def busy_s(events: Sequence[TraceEvent]) -> float:
    """Seconds spent in compute actions."""
    return sum(e.duration for e in events if e.op in COMPUTE_OPS)


def wait_s(events: Sequence[TraceEvent]) -> float:
    """Seconds spent waiting in receives."""
    return sum(e.duration for e in events if e.op in WAIT_OPS)


def span_s(events: Sequence[TraceEvent]) -> float:
    """From the first action's start to the last one's end."""
    return events[-1].end - events[0].start if events else 0.0


def step_bubble(traces: Sequence[Sequence[TraceEvent]]) -> float:
    """1 - (mean busy time of a stage) / (makespan), for one step whose stage traces (stages x events) share one
    clock. The makespan runs from the first compute action of any stage (the first stage's first forward) to the last
    one's end, so the fill and drain of the pipeline count and time a stage spends before the step begins elsewhere
    does not; busy time is forward, backward and update time. GPipe's ideal is (S-1)/(M+S-1)."""
    events = [e for trace in traces for e in trace if e.op in COMPUTE_OPS]
    if not events:
        raise ValueError("no compute events")
    makespan = max(e.end for e in events) - min(e.start for e in events)
    busy = [busy_s(trace) for trace in traces]
    return 1.0 - sum(busy) / len(busy) / makespan


def ideal_bubble(stages: int, microbatches: int) -> float:
    """(S-1)/(M+S-1): the idle share of each stage in GPipe or 1F1B with equal stages and free communication."""
    return (stages - 1) / (microbatches + stages - 1)
