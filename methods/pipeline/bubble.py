"""The measured bubble of a pipeline step, from the per-action traces of all its stages."""

from __future__ import annotations

from collections.abc import Sequence

COMPUTE_OPS = ("forward", "backward", "update")


def step_bubble(traces: Sequence[Sequence[Sequence]]) -> float:
    """1 - (mean busy time of a stage) / (makespan), for one step whose stage traces are lists of events
    (op, mb, start, end, version) with start and end on one clock. The makespan runs from the first compute action
    of any stage (the first stage's first forward) to the last one's end, so the fill and drain of the pipeline count
    and time a stage spends before the step begins elsewhere does not; busy time is forward, backward and update
    time. GPipe's ideal is (S-1)/(M+S-1)."""
    events = [e for trace in traces for e in trace if e[0] in COMPUTE_OPS]
    if not events:
        raise ValueError("no compute events")
    makespan = max(e[3] for e in events) - min(e[2] for e in events)
    busy = [sum(e[3] - e[2] for e in trace if e[0] in COMPUTE_OPS) for trace in traces]
    return 1.0 - sum(busy) / len(busy) / makespan


def ideal_bubble(stages: int, microbatches: int) -> float:
    """(S-1)/(M+S-1): the idle share of each stage in GPipe or 1F1B with equal stages and free communication."""
    return (stages - 1) / (microbatches + stages - 1)
