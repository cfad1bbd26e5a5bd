"""What a run folder measured, as the projection needs it: its configuration, step time, steps and time to the
target, compression costs and payloads, and a pipeline's traced steps and message sizes."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from harness.results import RunResult, reached_target, read_json
from harness.trace import TraceEvent, parse_events

#: Params that shape a run (batch, split, stages) rather than choose its algorithm: runs that differ only in these
#: share one calibration.
SHAPE_PARAMS = frozenset({"batch_size", "microbatches", "partition", "stages", "replicas", "trace_steps",
                          "eval_batch_size"})


def config_label(label: str, network: str, world_size: int) -> str:
    """A run label without its ' @ <network>' and its trailing ' x<world size>': what it is at any scale."""
    suffix = f" @ {network}"
    if network and label.endswith(suffix):
        label = label[: -len(suffix)]
    tail = f" x{world_size}"
    return label[: -len(tail)] if label.endswith(tail) else label


@dataclass
class RunMeasure:
    """One run, measured. step_s: train seconds per step (step_seconds); steps_to_target and time_to_target_s:
    the first evaluation at or above the target (None / NaN when never); compression: the per-step medians of the
    compression times and means of its bytes (after step 1); payload_mix: (payload / dense bytes, share of steps);
    comm_s: seconds per step the communicator timed for `gradients`; traces[step][worker]: the traced events;
    message_bytes[(kind, stage)]: bytes per message a stage sends ('act' forward, 'grad' back)."""

    run: RunResult
    label: str
    network: str
    step_s: float
    steps: int
    steps_to_target: int | None
    time_to_target_s: float
    compression: dict[str, float] = field(default_factory=dict)
    payload_mix: list[tuple[float, float]] = field(default_factory=list)
    collective: str | None = None
    comm_s: float = math.nan
    traces: dict[int, dict[int, list[TraceEvent]]] = field(default_factory=dict)
    message_bytes: dict[tuple[str, int], float] = field(default_factory=dict)
    partition: dict[str, Any] | None = None
    quantile: float = 0.5

    @property
    def traced_steps(self) -> list[int]:
        """The traced steps, without step 1 (the warm-up) when there are others."""
        return [s for s in sorted(self.traces) if not (s == 1 and len(self.traces) > 1)]

    def durations(self) -> dict[tuple[int, str, int], float]:
        """The `quantile` (median by default) of the traced actions' durations per (worker, op, stage) over the
        traced steps."""
        samples: dict[tuple[int, str, int], list[float]] = {}
        for step in self.traced_steps:
            for worker, events in self.traces[step].items():
                for e in events:
                    samples.setdefault((worker, e.op, e.stage), []).append(e.duration)
        return {key: float(np.quantile(values, self.quantile)) for key, values in samples.items()}

    @property
    def spec(self) -> dict[str, Any]:
        return self.run.spec

    @property
    def world_size(self) -> int:
        return int(self.spec["world_size"])

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.spec.get("params") or {})

    @property
    def batch_size(self) -> int:
        return int(self.params.get("batch_size") or 0)

    @property
    def microbatches(self) -> int:
        """A pipeline's M; 1 without the param, and for ddp's 'auto' (its accumulation, chosen by its plan: a
        data-parallel projection prices the rank's whole shard either way)."""
        value = self.params.get("microbatches")
        return value if isinstance(value, int) and value >= 1 else 1

    @property
    def is_pipeline(self) -> bool:
        return bool(self.traces)

    @property
    def key(self) -> str:
        """What calibration a run shares: method, workload and its options, and every param but SHAPE_PARAMS."""
        params = {k: v for k, v in self.params.items() if k not in SHAPE_PARAMS}
        return json.dumps([self.spec.get("method"), self.spec.get("workload"), self.spec.get("workload_options"),
                           params], sort_keys=True, default=str)


def numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    """frame[column] as floats (NaN where missing or not a number); all NaN when the column is absent (as
    harness.report.tables.numeric, which this package's layout row may not import)."""
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def step_seconds(train: pd.DataFrame, quantile: float = 0.5) -> tuple[float, int]:
    """(train seconds per step, steps), robust to the bursts of other work on a shared machine: per rank, the time
    of each step after the first (train time between consecutive records / steps between); the `quantile` (the
    median by default) of the steps of each payload ratio (one group without compression; DGC's warm-up stages are
    several), weighted by the groups' shares of steps; the max over ranks (the slowest rank sets the pace). NaN
    with fewer than two records."""
    best, steps = math.nan, 0
    for _, records in train.groupby(numeric(train, "rank")):
        records = records[numeric(records, "step").notna() & numeric(records, "train_time_s").notna()]
        step, time = numeric(records, "step").to_numpy(), numeric(records, "train_time_s").to_numpy()
        if len(step) < 2 or step[-1] <= step[0]:
            continue
        per_step = np.diff(time) / np.diff(step)
        ratio = (numeric(records, "payload_bytes") / numeric(records, "dense_bytes")).round(9).to_numpy()[1:]
        groups = pd.Series(per_step).groupby(pd.Series(ratio).fillna(-1.0))
        value = float(sum(group.quantile(quantile) * len(group) for _, group in groups) / len(per_step))
        best = value if math.isnan(best) else max(best, value)
        steps = max(steps, int(step[-1]))
    return best, steps


def measure(run: RunResult, quantile: float = 0.5) -> RunMeasure:
    """Read one run folder's numbers; per-step times are summarised by their `quantile` (step_seconds)."""
    spec, metrics = run.spec, run.metrics
    network = (spec.get("network") or {}) if isinstance(spec.get("network"), dict) else {}
    network_text = (network.get("rate", "") + (f",latency={network['latency']}" if network.get("latency") else "")
                    if network else "")
    train = metrics[metrics["kind"] == "train"]
    step_s, steps = step_seconds(train, quantile)
    evals = metrics[metrics["kind"] == "eval"]
    steps_to_target, time_to_target = None, math.nan
    if len(evals):
        reached = evals[reached_target(evals, spec)]
        if len(reached):
            steps_to_target = int(numeric(reached, "step").iloc[0])
            time_to_target = float(numeric(reached, "train_time_s").iloc[0])
    out = RunMeasure(run, config_label(run.label, network_text, int(spec["world_size"])), network_text, step_s,
                     steps, steps_to_target, time_to_target, quantile=quantile)
    later = train[numeric(train, "step") > 1]
    for column in ("compress_s", "decompress_s", "communicate_s", "payload_bytes", "dense_bytes"):
        values = numeric(later, column).dropna()
        if len(values):
            out.compression[column] = float(values.quantile(quantile) if column.endswith("_s") else values.mean())
    if "payload_bytes" in out.compression and out.compression.get("dense_bytes"):
        ratios = (numeric(later, "payload_bytes") / numeric(later, "dense_bytes")).dropna()
        counts = Counter(round(float(r), 9) for r in ratios)
        out.payload_mix = [(ratio, count / len(ratios)) for ratio, count in sorted(counts.items())]
    if "collective" in later.columns and later["collective"].notna().any():
        out.collective = str(later["collective"].dropna().iloc[0])
    comm = metrics[metrics["kind"] == "comm"]
    if len(comm) and steps:
        seconds = [float((row or {}).get("gradients", math.nan)) for row in comm.get("seconds_by_category", [])]
        if seconds and not all(math.isnan(s) for s in seconds):
            out.comm_s = float(np.nanmean(seconds)) / steps
    read_pipeline(out, metrics, train)
    return out


def read_pipeline(out: RunMeasure, metrics: pd.DataFrame, train: pd.DataFrame) -> None:
    """Fill the traces (trace records), the bytes per message of each stage, and partition.json."""
    traces = metrics[metrics["kind"] == "trace"]
    for record in traces.to_dict("records"):
        worker = record.get("worker")
        if worker is None or (isinstance(worker, float) and math.isnan(worker)):
            worker = record.get("rank")
        events = parse_events(record.get("events"), int(record.get("stage", -1) if pd.notna(
            record.get("stage", math.nan)) else -1))
        out.traces.setdefault(int(record["step"]), {})[int(worker)] = events
    if not out.traces:
        return
    out.partition = read_json(out.run.run_dir / "partition.json")
    last = train.sort_values("step").groupby(numeric(train, "rank")).tail(1)
    template = out.traces[max(out.traces)]
    for record in last.to_dict("records"):
        rank, step = int(record["rank"]), int(record["step"])
        events = template.get(rank, [])
        for kind, op, category in (("act", "send_act", "activations"), ("grad", "send_grad", "activation_grads")):
            sends = [e for e in events if e.op == op]
            sent = ((record.get("bytes_by_category") or {}).get(category) or [0, 0])[0]
            if sends and step:
                for stage in {e.stage for e in sends}:
                    out.message_bytes[(kind, stage)] = sent / step / len(sends)
