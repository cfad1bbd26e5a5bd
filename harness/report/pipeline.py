"""The pipeline part of the report: measured bubbles and a Gantt chart per pipeline run, from `trace` records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from harness.report.figures import new_figure
from harness.results import RunResult
from harness.suite.spec import safe_name
from harness.trace import COMPUTE_OPS, TraceEvent, ideal_bubble, parse_events, step_bubble

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "update": "#55a868", "recv_act": "#cccccc",
          "recv_grad": "#cccccc"}


def traced_steps(run: RunResult) -> dict[int, list[list[TraceEvent]]]:
    """step -> every stage's events (stages x TraceEvents) for the steps a pipeline run traced in full (all
    stages present). Empty for runs without `trace` records, and for the virtual mode (world size 1), whose stages
    take turns in one process, so its timeline has no overlap to measure."""
    metrics = run.metrics
    if not {"events", "step", "stage"} <= set(metrics.columns) or not _int(run.spec.get("world_size")) > 1:
        return {}
    records = metrics[metrics["kind"] == "trace"]
    steps: dict[int, dict[int, list]] = {}
    for step, stage, events in zip(records["step"], records["stage"], records["events"], strict=True):
        if isinstance(events, list) and _int(step) >= 0 and _int(stage) >= 0:
            steps.setdefault(_int(step), {})[_int(stage)] = parse_events(events)
    world = int(run.spec["world_size"])
    return {step: [by_stage[s] for s in range(world)] for step, by_stage in sorted(steps.items())
            if len(by_stage) == world}


def _int(value: object) -> int:
    """An integer field of a record, or -1 when it is missing or not a number (a corrupt record loses only itself)."""
    try:
        return int(value) if not (isinstance(value, float) and math.isnan(value)) else -1
    except (TypeError, ValueError):
        return -1


def measured_bubble(run: RunResult) -> float:
    """The median over traced steps of 1 - mean stage busy time / step makespan; NaN without traces."""
    bubbles = [step_bubble(stages) for stages in traced_steps(run).values()]
    return float(pd.Series(bubbles).median()) if bubbles else math.nan


def ideal_bubble_of(run: RunResult) -> float:
    """(S-1)/(M+S-1) for a flushed pipeline run (its spec has `microbatches`), else NaN."""
    params = run.spec.get("params") or {}
    stages, micro = run.spec.get("world_size"), params.get("microbatches")
    return ideal_bubble(stages, micro) if stages and micro else math.nan


def plot_gantt(run: RunResult) -> Figure:
    """One pipeline run -> the timeline of its last fully traced step: a row per stage, a bar per action
    (forward, backward, update; receive waits in grey), times in ms from the step's first action."""
    from matplotlib.patches import Patch

    step, stages = list(traced_steps(run).items())[-1]
    origin = min(e.start for events in stages for e in events if e.op in COMPUTE_OPS)
    fig = new_figure(width=9.0, height=1.6 + 0.6 * len(stages))
    ax = fig.subplots()
    for s, events in enumerate(stages):
        for op, mb, start, end, _ in events:
            start = max(start, origin)  # a wait that began before the step's first forward is not drawn
            if op not in COLORS or end <= start:
                continue
            ax.broken_barh([((start - origin) * 1e3, (end - start) * 1e3)], (s - 0.4, 0.8), facecolors=COLORS[op],
                           edgecolor="white", linewidth=0.3)
            if op in ("forward", "backward") and mb >= 0:
                ax.text((start + end - 2 * origin) / 2 * 1e3, s, str(mb), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(stages)), [f"stage {s}" for s in range(len(stages))])
    ax.invert_yaxis()
    ax.set_xlabel("time from the step's first forward (ms)")
    ideal = ideal_bubble_of(run)
    text = f"measured bubble {step_bubble(stages):.3f}" + ("" if math.isnan(ideal) else f", ideal {ideal:.3f}")
    ax.set_title(f"{run.label} (seed {run.spec.get('seed')}), step {step}: {text}", fontsize="medium")
    ax.legend(handles=[Patch(color=COLORS[k], label=k.replace("recv_act", "waiting")) for k in
                       ("forward", "backward", "update", "recv_act")], fontsize="small", loc="upper center",
              bbox_to_anchor=(0.5, -0.35 if len(stages) < 3 else -0.2), ncol=4, frameon=False)
    return fig


def gantt_figures(runs: Sequence[RunResult]) -> dict[str, Figure]:
    """One Gantt chart per pipeline label (its lowest seed's run), named gantt_<label>.png."""
    chosen: dict[str, RunResult] = {}
    for run in runs:
        if traced_steps(run) and (run.label not in chosen or (run.spec.get("seed") or 0) < (
                chosen[run.label].spec.get("seed") or 0)):
            chosen[run.label] = run
    return {f"gantt_{safe_name(label)}.png": plot_gantt(run) for label, run in sorted(chosen.items())}

