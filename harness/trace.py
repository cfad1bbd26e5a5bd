"""The trace format of pipeline runs (part of the results contract) and the bubble arithmetic over it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from harness.schedule.ir import COMPUTE, RECEIVES


class ScheduledAction(Protocol):
    """What the harness reads of a method's schedule action: the op (a TraceEvent op, or a str enum of one), its
    stage, microbatch (None for an update) and iteration."""

    @property
    def op(self) -> str: ...
    @property
    def stage(self) -> int: ...
    @property
    def mb(self) -> int | None: ...
    @property
    def iteration(self) -> int: ...


@dataclass(frozen=True)
class StepSchedule:
    """One step of a pipeline's schedule in its steady state, one action list per rank, exactly as its executor runs
    it; the next step's microbatch ids are these plus `shift` (an update keeps none), its iteration ids these plus
    `iteration_shift` (a schedule that names its microbatches per iteration, or keeps several in flight).
    `stages`: the model stages the actions name when a rank holds several (interleaved 1F1B); None: one per rank.
    `forward_lane`: the ops a rank runs on a lane (thread) of their own, at the same time as its other ops on a
    second lane (Q-FB: receiving, computing and sending activations); each lane keeps the list's order. Empty: one
    lane."""

    ranks: Sequence[Sequence[ScheduledAction]]
    shift: int
    iteration_shift: int = 0
    stages: int | None = None
    forward_lane: tuple[str, ...] = ()

    def lane(self, op: str) -> int:
        """The lane an op runs on: 0 for the forward lane's ops, else 1; 0 for every op when there is one lane."""
        return int(bool(self.forward_lane) and op not in self.forward_lane)

    @property
    def stage_count(self) -> int:
        """How many model stages the step's actions run on."""
        return self.stages if self.stages is not None else len(self.ranks)


class TraceEvent(NamedTuple):
    """One action a worker (rank) ran. In metrics.jsonl a `trace` record holds `events`, a list of these as JSON
    arrays (field order as here), with `step` and `worker` (the rank whose actions they are; older records name a
    `stage` instead, and their events stop at `version`).

    op: forward, backward, update, sync_grads, recv_act, send_act, recv_grad or send_grad.
    mb: the microbatch (or minibatch) id; the round for sync_grads; -1 for an update.
    start, end: time.perf_counter() readings, comparable across the processes of one host.
    version: the weight version a forward or backward used; -1 for other actions.
    stage: the pipeline stage the action belongs to (-1 when unknown: older records).
    iteration: which iteration the microbatch belongs to, when a schedule keeps several in flight (else 0).
    lane: which of a stage's concurrent lanes ran it (0 unless a method runs forwards and backwards in parallel).
    """

    op: str
    mb: int
    start: float
    end: float
    version: int = -1
    stage: int = -1
    iteration: int = 0
    lane: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


def parse_events(rows: Any, stage: int = -1) -> list[TraceEvent]:
    """A trace record's `events` -> TraceEvents; rows that are not [op, mb, start, end, version?, stage?, iteration?,
    lane?] are skipped, so a damaged record loses only its bad rows. `stage` fills in rows without one (older
    records)."""
    events = []
    if not isinstance(rows, list):
        return events
    for row in rows:
        if not isinstance(row, (list, tuple)) or len(row) < 4:
            continue
        try:
            version = int(row[4]) if len(row) > 4 else -1
            row_stage = int(row[5]) if len(row) > 5 else stage
            iteration = int(row[6]) if len(row) > 6 else 0
            lane = int(row[7]) if len(row) > 7 else 0
            events.append(TraceEvent(str(row[0]), int(row[1]), float(row[2]), float(row[3]), version, row_stage,
                                     iteration, lane))
        except (TypeError, ValueError):
            continue
    return events


def busy_s(events: Sequence[TraceEvent]) -> float:
    """Seconds spent in compute actions."""
    return sum(e.duration for e in events if e.op in COMPUTE)


def wait_s(events: Sequence[TraceEvent]) -> float:
    """Seconds spent waiting in receives."""
    return sum(e.duration for e in events if e.op in RECEIVES)


def span_s(events: Sequence[TraceEvent]) -> float:
    """From the first action's start to the last one's end."""
    return events[-1].end - events[0].start if events else 0.0


def step_bubble(traces: Sequence[Sequence[TraceEvent]]) -> float:
    """1 - (mean busy time of a rank) / (makespan), for one step whose rank traces (ranks x events) share one clock.
    The makespan runs from the first compute action of any rank (the first stage's first forward) to the last one's
    end, so the fill and drain of the pipeline count and time a rank spends before the step begins elsewhere does
    not; busy time is forward, backward and update time. GPipe's ideal is (S-1)/(M+S-1)."""
    events = [e for trace in traces for e in trace if e.op in COMPUTE]
    if not events:
        raise ValueError("no compute events")
    makespan = max(e.end for e in events) - min(e.start for e in events)
    busy = [busy_s(trace) for trace in traces]
    return 1.0 - sum(busy) / len(busy) / makespan


def zb_h1_bubble(ranks: int, microbatches: int, forward: float, backward: float, weight: float) -> float:
    """ZB-H1's idle share of each of p ranks (Qi et al. 2024, Sec. 3.1): (p-1)(T_F + T_B - T_W) over
    M(T_F + T_B + T_W) + (p-1)(T_F + T_B - T_W), with B the input-gradient and W the weight-gradient pass."""
    idle = (ranks - 1) * (forward + backward - weight)
    return idle / (microbatches * (forward + backward + weight) + idle)


def ideal_bubble(ranks: int, microbatches: int, chunks: int = 1) -> float:
    """(p-1)/(v·M+p-1): the idle share of each of p ranks in GPipe or 1F1B (v = 1 stage per rank) or interleaved
    1F1B (v stages per rank), with equal stages and free communication (Narayanan et al. 2021, section 2.2)."""
    return (ranks - 1) / (chunks * microbatches + ranks - 1)
