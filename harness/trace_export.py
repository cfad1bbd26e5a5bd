"""Pipeline traces in the Chrome trace-event format (Perfetto, chrome://tracing): a track per rank, stage and lane,
and the messages between stages as flow arrows."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.results import read_jsonl
from harness.trace import TraceEvent, parse_events

SHORT = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W", "update": "U",
         "sync_grads": "S", "recv_act": "rA", "send_act": "sA", "recv_grad": "rG", "send_grad": "sG"}


def track(event: TraceEvent) -> int:
    """The thread id of an event's track within its rank: 100·stage + lane."""
    return 100 * max(event.stage, 0) + event.lane


def message_id(event: TraceEvent) -> tuple[str, int, int, int] | None:
    """The message a send or receive handles, (kind, sending stage, iteration, microbatch); None for other actions."""
    if event.op in ("send_act", "send_grad"):
        return (event.op[5:], event.stage, event.iteration, event.mb)
    if event.op == "recv_act":
        return ("act", event.stage - 1, event.iteration, event.mb)
    if event.op == "recv_grad":
        return ("grad", event.stage + 1, event.iteration, event.mb)
    return None


def chrome_trace(steps: Mapping[int, Mapping[int, Iterable[TraceEvent]]]) -> dict[str, Any]:
    """steps: step -> rank -> that rank's events of the step -> a Chrome trace (JSON object format).

    Every event is a complete slice ('X') on process = rank, thread = 100·stage + lane, named as torch prints its IR
    ('0F3': stage 0, forward, microbatch 3), with step, microbatch, iteration and weight version in its args. Each
    message gets a flow arrow from its send to its receive (matched by kind, sending stage, iteration, microbatch
    within a step). Times are microseconds from the first event."""
    all_events = [(step, rank, e) for step, ranks in steps.items() for rank, events in ranks.items()
                  for e in events]
    origin = min((e.start for _, _, e in all_events), default=0.0)
    out: list[dict[str, Any]] = []
    tracks: set[tuple[int, int, int, int]] = set()
    sends: dict[tuple, dict[str, Any]] = {}
    receives: list[tuple[tuple, dict[str, Any]]] = []
    for step, rank, e in all_events:
        tid = track(e)
        tracks.add((rank, tid, e.stage, e.lane))
        name = f"{max(e.stage, 0)}{SHORT.get(e.op, e.op)}{'' if e.mb < 0 else e.mb}"
        ts, dur = (e.start - origin) * 1e6, max(0.0, e.end - e.start) * 1e6
        out.append({"name": name, "cat": e.op, "ph": "X", "ts": ts, "dur": dur, "pid": rank, "tid": tid,
                    "args": {"step": step, "mb": e.mb, "iteration": e.iteration, "version": e.version}})
        message = message_id(e)
        if message is not None:
            anchor = {"pid": rank, "tid": tid, "ts": ts + dur / 2}
            if e.op.startswith("send"):
                sends[(step, *message)] = anchor
            else:
                receives.append(((step, *message), anchor))
    for flow, (key, anchor) in enumerate((k, a) for k, a in receives if k in sends):
        kind, stage = key[1], key[2]
        common = {"name": f"{kind} {stage}→{stage + (1 if kind == 'act' else -1)}", "cat": "message", "id": flow + 1}
        out.append({**common, "ph": "s", **sends[key]})
        out.append({**common, "ph": "f", "bp": "e", **anchor})
    for rank in sorted({r for r, _, _, _ in tracks}):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
    for rank, tid, stage, lane in sorted(tracks):
        label = f"stage {stage}" + (f" lane {lane}" if lane else "")
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": label}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def steps_from_metrics(path: Path) -> dict[int, dict[int, list[TraceEvent]]]:
    """A run's metrics.jsonl -> step -> rank -> events, from its `trace` records (worker, or else stage, names the
    track's rank)."""
    steps: dict[int, dict[int, list[TraceEvent]]] = {}
    for record in read_jsonl(path):
        if record.get("kind") != "trace" or not isinstance(record.get("step"), int):
            continue
        rank = record.get("worker", record.get("stage"))
        if not isinstance(rank, int):
            continue
        stage = record.get("stage", -1) if isinstance(record.get("stage"), int) else -1
        steps.setdefault(record["step"], {}).setdefault(rank, []).extend(parse_events(record.get("events"), stage))
    return steps


def write_chrome_trace(metrics: Path, out: Path) -> bool:
    """Write the Chrome trace of a run's traced steps to `out`; False (nothing written) when it traced nothing."""
    steps = steps_from_metrics(metrics)
    if not steps:
        return False
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(chrome_trace(steps)))
    tmp.replace(out)
    return True
