"""What a pipeline run records besides its losses: each stage's measured compute (for partition.json), a step's
busy, wait and span seconds, and the stages' memory peaks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.comm.communicator import Communicator
from harness.trace import busy_s, span_s, wait_s
from methods.pipeline.core.executor import Trace
from methods.pipeline.core.planning import StageTimes
from methods.pipeline.core.stage import Stage


class StageClock:
    """Forward and backward seconds (and counts) per stage, summed over the run from the executors' traces."""

    def __init__(self, num_stages: int):
        self.times = {s: StageTimes() for s in range(num_stages)}

    def add(self, trace: Trace) -> None:
        for event in trace.events:
            times = self.times[event.stage]
            if event.op == "forward":
                times.forward_s += event.duration
                times.forwards += 1
            elif event.op in ("backward", "backward_input", "backward_weight"):  # a split backward: B + W
                times.backward_s += event.duration
                times.backwards += event.op != "backward_weight"

    def measured(self, comm: Communicator | None) -> list[StageTimes]:
        """Per stage, the measured compute over the run, summed over ranks (each rank measured its own stages):
        `comm` all-reduces the table (None: the virtual mode, every stage measured here)."""
        table = torch.stack([self.times[s].as_tensor() for s in range(len(self.times))])
        if comm is not None:
            comm.all_reduce(table, "control")
        return [StageTimes.from_tensor(row) for row in table]


def step_extra(traces: list[Trace], virtual: bool) -> dict[str, Any]:
    """A step's busy seconds per worker (virtual mode), or this rank's busy, wait and span seconds."""
    if virtual:
        return {"busy_s": [busy_s(t.events) for t in traces]}
    events = traces[0].events
    return {"busy_s": busy_s(events), "wait_s": wait_s(events), "span_s": span_s(events)}


def memory_peaks(workers: Mapping[tuple[int, int], Stage]) -> dict[str, list[int]]:
    """Per stage held here (the max over its replicas in the virtual mode): the peak activation bytes (autograd's
    saved tensors with the stage's kept inputs and outputs), microbatches and weight-version bytes of this step
    (the stages' peaks are reset)."""
    peaks: dict[int, list[int]] = {}
    for (_, s), stage in workers.items():
        peak = stage.take_peak()
        row = peaks.setdefault(s, [0, 0, 0])
        row[:] = [max(row[0], peak.activation_bytes + peak.buffer_bytes), max(row[1], peak.microbatches),
                  max(row[2], peak.weight_bytes)]
    order = sorted(peaks)
    return {"stages": order, "peak_activation_bytes": [peaks[s][0] for s in order],
            "peak_microbatches": [peaks[s][1] for s in order], "peak_weight_bytes": [peaks[s][2] for s in order]}
