"""The pipeline part of the report: measured bubbles and a Gantt chart per pipeline run, from `trace` records."""

from __future__ import annotations

import html
import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from harness.report.figures import new_figure
from harness.results import RunResult
from harness.schedule.ir import COMPUTE
from harness.suite.spec import safe_name
from harness.trace import TraceEvent, ideal_bubble, parse_events, step_bubble, zb_h1_bubble

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "backward_input": "#dd8452", "backward_weight": "#c44e52",
          "update": "#55a868", "sync_grads": "#8172b3", "recv_act": "#cccccc", "recv_grad": "#cccccc"}
#: The compute bars that name their microbatch (a zero-bubble B is orange like a whole backward, its W red).
LABELLED = ("forward", "backward", "backward_input", "backward_weight")


def traced_steps(run: RunResult) -> dict[int, list[list[TraceEvent]]]:
    """step -> every rank's events (ranks x TraceEvents) for the steps a pipeline run traced in full (all ranks
    present). Records name their rank as `worker` (older ones as `stage`, one stage per rank). Empty for runs without
    `trace` records, and for the virtual mode (world size 1), whose ranks take turns in one process, so its timeline
    has no overlap to measure."""
    metrics = run.metrics
    column = "worker" if "worker" in metrics.columns else "stage"
    if not {"events", "step", column} <= set(metrics.columns) or not _int(run.spec.get("world_size")) > 1:
        return {}
    records = metrics[metrics["kind"] == "trace"]
    steps: dict[int, dict[int, list]] = {}
    for step, worker, events, stage in zip(records["step"], records[column], records["events"],
                                           records["stage"] if "stage" in records.columns else records[column],
                                           strict=True):
        if isinstance(events, list) and _int(step) >= 0 and _int(worker) >= 0:
            steps.setdefault(_int(step), {})[_int(worker)] = parse_events(events, _int(stage))
    world = int(run.spec["world_size"])
    return {step: [by_rank[r] for r in range(world)] for step, by_rank in sorted(steps.items())
            if len(by_rank) == world}


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
    """(p-1)/(v·M+p-1) for a flushed pipeline run on p ranks with v stages each (its spec has `microbatches`; v is
    `stages_per_rank`, default 1); for zb-h1 its own formula (harness.trace.zb_h1_bubble) with the traced passes'
    median times; else NaN (asynchronous or replicated pipelines, and pipelines whose ranks run
    several lanes at once, have no closed form here)."""
    params = run.spec.get("params") or {}
    ranks, micro = run.spec.get("world_size"), params.get("microbatches")
    if not ranks or not micro or params.get("replicas") or (params.get("lanes") or 1) > 1:
        return math.nan
    if run.spec.get("method") == "zb-h1":  # its formula needs the passes' times: the traced medians
        events = [e for steps in traced_steps(run).values() for rank in steps for e in rank]

        def median(op: str) -> float:  # stage 0's B is its whole backward and its W empty: the other stages'
            times = [e.duration for e in events if e.op == op and (op == "forward" or e.stage > 0)]
            return float(pd.Series(times).median()) if times else math.nan
        return zb_h1_bubble(ranks, micro, median("forward"), median("backward_input"), median("backward_weight"))
    return ideal_bubble(ranks, micro, params.get("stages_per_rank") or 1)


def _bar_label(event: TraceEvent, several_stages: bool) -> str:
    text = f"{event.stage}.{event.mb}" if several_stages else str(event.mb)
    return text + (f"@{event.iteration}" if event.iteration else "")


def _fitting_size(text: str, width_pt: float, largest: float = 8.0, smallest: float = 5.0) -> float:
    """The font size (points) at which `text` fits a bar `width_pt` points wide (a character is about 0.6 of the
    size wide, plus a little room), at most `largest`; 0 when even `smallest` does not fit: the label is left out."""
    if not text:
        return 0.0
    size = min(largest, width_pt / (0.6 * len(text) + 0.8))
    return size if size >= smallest else 0.0


#: The gantt's title wraps at this many characters: the width of its 9-inch figure at a medium font.
GANTT_TITLE_CHARACTERS = 90


def plot_gantt(run: RunResult) -> Figure:
    """One pipeline run -> the timeline of its last fully traced step: a row per rank (per rank and lane where a
    rank runs several lanes at once, as qfb's forward and backward lanes), a bar per action (forward, backward,
    update, replica sync; receive waits in grey), labelled by microbatch (stage.microbatch where a rank holds several
    stages) in a font sized to fit the bar (no label on a bar too narrow for one), times in ms from the step's first
    compute action."""
    from matplotlib.patches import Patch

    step, ranks = list(traced_steps(run).items())[-1]
    origin = min(e.start for events in ranks for e in events if e.op in COMPUTE)
    rows = [(r, lane) for r, events in enumerate(ranks) for lane in sorted({e.lane for e in events} or {0})]
    fig = new_figure(width=9.0, height=1.6 + 0.6 * len(rows))
    ax = fig.subplots()
    span_ms = max(e.end for events in ranks for e in events) * 1e3 - origin * 1e3
    ax.set_xlim(0, span_ms)
    points_per_ms = 72 * 0.8 * 9.0 / span_ms if span_ms > 0 else 0.0  # the axes hold about 80% of the width
    for row, (r, lane) in enumerate(rows):
        events = [e for e in ranks[r] if e.lane == lane]
        several = len({e.stage for e in ranks[r]}) > 1
        for e in events:
            start = max(e.start, origin)  # a wait that began before the step's first forward is not drawn
            if e.op not in COLORS or e.end <= start:
                continue
            ax.broken_barh([((start - origin) * 1e3, (e.end - start) * 1e3)], (row - 0.4, 0.8),
                           facecolors=COLORS[e.op], edgecolor="white", linewidth=0.3)
            text = _bar_label(e, several) if e.op in LABELLED and e.mb >= 0 else ""
            size = _fitting_size(text, (e.end - start) * 1e3 * points_per_ms)
            if size:
                ax.text((start + e.end - 2 * origin) / 2 * 1e3, row, text, ha="center", va="center", fontsize=size)
    laned = {r for r, lane in rows if lane}
    ax.set_yticks(range(len(rows)), [f"rank {r}" + (f" lane {lane}" if r in laned else "") for r, lane in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time from the step's first compute action (ms)")
    ideal = ideal_bubble_of(run)
    text = f"measured bubble {step_bubble(ranks):.3f}" + ("" if math.isnan(ideal) else f", ideal {ideal:.3f}")
    # Wrapped to the figure's width (about 95 characters at this size), so a long label is never clipped.
    title = f"{run.label} (seed {run.spec.get('seed')}), step {step}: {text}"
    ax.set_title("\n".join(textwrap.wrap(title, GANTT_TITLE_CHARACTERS)), fontsize="medium")
    ran = {e.op for events in ranks for e in events}
    shown = [k for k in ("forward", "backward", "backward_input", "backward_weight", "update", "sync_grads",
                         "recv_act") if k in ran or k in ("forward", "update", "recv_act")]
    ax.legend(handles=[Patch(color=COLORS[k], label=k.replace("recv_act", "waiting")) for k in shown],
              fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(rows) < 3 else -0.2),
              ncol=len(shown), frameon=False)
    return fig


def gantt_figures(runs: Sequence[RunResult]) -> dict[str, Figure]:
    """One Gantt chart per pipeline label (its lowest seed's run), named gantt_<label>.png."""
    chosen: dict[str, RunResult] = {}
    for run in runs:
        if traced_steps(run) and (run.label not in chosen or (run.spec.get("seed") or 0) < (
                chosen[run.label].spec.get("seed") or 0)):
            chosen[run.label] = run
    return {f"gantt_{safe_name(label)}.png": plot_gantt(run) for label, run in sorted(chosen.items())}



def pipeline_html(runs: Sequence[RunResult], table: pd.DataFrame, report_dir: Path) -> str:
    """The 'Pipelines' section: per pipeline label the measured bubble and the peak bytes a stage held (activations,
    weight versions), means over seeds, and a link to each run's trace.json (open it in Perfetto or
    chrome://tracing); '' when no run is a pipeline."""
    rows = table[table["family"] == "pipeline"]
    if rows.empty:
        return ""
    e = html.escape
    shown = rows.groupby("label", sort=False)[["bubble", "peak_activation_bytes", "peak_weight_bytes"]].mean()
    body = "".join(f"<tr><td>{e(str(label))}</td><td>{_fmt(r.bubble, '.3f')}</td>"
                   f"<td>{_fmt(r.peak_activation_bytes, ',.0f')}</td><td>{_fmt(r.peak_weight_bytes, ',.0f')}</td></tr>"
                   for label, r in shown.iterrows())
    links = []
    for run in runs:
        trace = run.run_dir / "trace.json"
        if trace.exists():
            target = os.path.relpath(trace, report_dir)
            links.append(f'<li><a href="{e(target)}">{e(run.run_dir.name)}/trace.json</a></li>')
    traces = (f"<p>Traced steps in the Chrome trace format (a track per rank, stage and lane; messages as arrows): "
              f"open in Perfetto (ui.perfetto.dev) or chrome://tracing.</p><ul>{''.join(links)}</ul>" if links else "")
    return f"""<h2>Pipelines</h2>
<p>Bubble: the measured idle share of a step (multi-process runs). Peak bytes: the most a stage held in any step, over
stages and seeds' mean: stored activations for backwards, and stashed or predicted weight versions.</p>
<table><tr><th>label</th><th>bubble</th><th>peak activation bytes</th><th>peak weight bytes</th></tr>{body}</table>
{traces}
"""


def _fmt(value: float, spec: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)
