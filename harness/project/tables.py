"""The projection grid (configurations x world sizes x networks) and the validation against held-out runs, as
DataFrames."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.project.dpmodel import DataParallelModel
from harness.project.host import DEDICATED, Host, host_of
from harness.project.measured import RunMeasure, config_label
from harness.project.model import Projected
from harness.project.partition import stage_ranges
from harness.project.pipemodel import PipelineModel
from harness.project.progress import phase
from harness.project.suite import CalibratedSuite, Calibration, Settings, shape
from harness.schedule.ir import COMPUTE, SENDS
from harness.trace import step_bubble

PROJECTION_COLUMNS = ("method", "workload", "label", "world_size", "network", "batch_size", "step_time_s",
                      "samples_per_s", "time_to_target_s", "compute_s", "compression_s", "exposed_comm_s", "bubble_s",
                      "other_s", "bubble", "speedup", "note")
TTT_ASSUMPTION = ("time to target = projected step time x the steps the calibration runs took to reach the target "
                  "at the same global batch (assumed unchanged by world size and network)")


def project_one(calibration: Calibration, world_size: int, network: str, settings: Settings,
                batch: int | None = None, microbatches: int | None = None,
                ranges: list[tuple[int, int]] | None = None, emulated: bool | None = None,
                host: Host = DEDICATED) -> Projected:
    """One configuration at one world size and network (a Link from settings; emulated as Settings.link), its ranks
    on `host` (default: one rank per node, never waiting for a core)."""
    model = calibration.model
    link = settings.link(network, emulated)
    if isinstance(model, PipelineModel):
        return model.project(world_size, link, batch, microbatches, ranges, host)
    return model.project(world_size, link, batch, host=host)


def row(calibration: Calibration, world_size: int, network: str, projected: Projected, batch: int) -> dict:
    """One projection row (PROJECTION_COLUMNS but speedup)."""
    parts, steps = projected.parts, calibration.steps_to_target
    same_batch = batch == calibration.model.batch_size
    return {"method": calibration.model.method, "workload": calibration.workload, "label": calibration.model.label,
            "world_size": world_size,
            "network": network, "batch_size": batch, "step_time_s": parts.step_s,
            "samples_per_s": batch / parts.step_s if parts.step_s > 0 else math.nan,
            "time_to_target_s": parts.step_s * steps if steps is not None and same_batch else math.nan,
            "compute_s": parts.compute_s, "compression_s": parts.compression_s,
            "exposed_comm_s": parts.exposed_comm_s, "bubble_s": parts.bubble_s, "other_s": parts.other_s,
            "bubble": projected.bubble, "note": "; ".join(dict.fromkeys(projected.notes))}


def projection_table(suite: CalibratedSuite, world_sizes: Sequence[int], networks: Sequence[str],
                     settings: Settings, baseline: str | None) -> pd.DataFrame:
    """Every calibrated configuration at every world size and network -> rows of PROJECTION_COLUMNS; speedup is
    samples_per_s over its workload's baseline's (workload_bases) at the same world size and network, NaN where its
    workload has none."""
    rows = [row(c, n, net, project_one(c, n, net, settings), c.model.batch_size)
            for c in suite.calibrations for n in world_sizes for net in networks]
    frame = pd.DataFrame(rows, columns=[c for c in PROJECTION_COLUMNS if c != "speedup"])
    bases = {workload: c.model.label for workload, c in workload_bases(suite, baseline).items()}
    base = frame[[bases.get(w) == label for w, label in zip(frame["workload"], frame["label"], strict=True)]]
    base = base.set_index(["workload", "world_size", "network"])["samples_per_s"]
    frame["speedup"] = [r.samples_per_s / base.get((r.workload, r.world_size, r.network), math.nan)
                        for r in frame.itertuples()]
    return frame[list(PROJECTION_COLUMNS)]


def workload_bases(suite: CalibratedSuite, baseline: str | None) -> dict[str, Calibration]:
    """{workload: the configuration its others are compared with}: the one labelled `baseline` there, else the
    workload's first ddp configuration, else none (a workload's throughput is never compared with another's)."""
    bases = {c.workload: c for c in suite.calibrations if c.model.label == baseline}
    for c in suite.calibrations:
        if c.model.method == "ddp":
            bases.setdefault(c.workload, c)
    return bases


def choose_baseline(suite: CalibratedSuite, requested: str | None) -> str | None:
    """The requested label (with or without ' xN' and ' @ net'), else the first ddp configuration's."""
    labels = [c.model.label for c in suite.calibrations]
    if requested is not None:
        for c in suite.calibrations:
            if c.model.label in (requested, config_label(requested, "", c.model.world_size)) or (
                    requested == c.runs[0].run.label):
                return c.model.label
        raise ValueError(f"--baseline {requested!r}: no calibrated configuration has that label "
                         f"(labels: {', '.join(labels)})")
    return next((c.model.label for c in suite.calibrations if c.model.method == "ddp"), labels[0] if labels else None)


def measured_bubble(run: RunMeasure) -> float:
    """Median over the traced steps of harness.trace.step_bubble."""
    values = [step_bubble(list(run.traces[s].values())) for s in run.traced_steps]
    return statistics.median(values) if values else math.nan


def measured_busy(run: RunMeasure) -> float:
    """The run's quantile over the traced steps of the mean busy time of a rank (compute and sends), as the
    simulator's compute part counts it."""
    values = [statistics.fmean(sum(e.duration for e in events if e.op in COMPUTE or e.op in SENDS)
                               for events in run.traces[s].values()) for s in run.traced_steps]
    return float(np.quantile(values, run.quantile)) if values else math.nan


def terms(calibration: Calibration, runs: list[RunMeasure], projected: Projected, world_size: int) -> dict:
    """Measured against projected per term where the runs measured it: compression compute (compress + decode),
    communication (launch to arrival, summed over buckets), and a pipeline's busy time per rank and bubble."""
    model = calibration.model
    out: dict[str, float] = {}
    if isinstance(model, DataParallelModel):
        comp = [m.compression for m in runs if "compress_s" in m.compression]
        if comp:
            out["measured_compression_s"] = statistics.fmean(
                c["compress_s"] + c.get("decompress_s", 0.0) for c in comp)
            decode = model.decompress_s * (world_size / model.world_size if model.collective == "all_gather" else 1)
            out["projected_compression_s"] = model.compress_s + decode
        comm = [m.compression.get("communicate_s", m.comm_s) for m in runs]
        out["measured_comm_s"] = statistics.fmean(comm) if comm else math.nan
        out["projected_comm_s"] = projected.parts.comm_s
    else:
        out["measured_busy_s"] = statistics.fmean(measured_busy(m) for m in runs)
        out["projected_busy_s"] = projected.parts.compute_s
        out["measured_bubble"] = statistics.fmean(measured_bubble(m) for m in runs)
        out["projected_bubble"] = projected.bubble
    return out


def validation_table(suite: CalibratedSuite, settings: Settings) -> pd.DataFrame:
    """Every held-out configuration (runs not on the calibration network and world size, grouped over seeds by
    label, world size and network) projected from its configuration's calibration, next to what it measured:
    step time and time to target with the relative error projected / measured - 1, and the terms."""
    groups: dict[tuple, list[RunMeasure]] = {}
    for m in suite.measures:
        if not suite.is_calibration(m):
            groups.setdefault((m.label, m.world_size, m.network, shape(m)), []).append(m)
    rows = []
    for (label, world_size, network, _), runs in phase(groups.items(), "validation (held-out configurations)",
                                                        "configuration"):
        calibration = suite.for_run(runs[0])
        if calibration is None:
            continue
        first = runs[0]
        ranges = stage_ranges(first) if first.is_pipeline else None
        projected = project_one(calibration, world_size, network, settings, first.batch_size, first.microbatches,
                                ranges or None, emulated=True, host=host_of(first.spec, first.run.manifest))
        out = row(calibration, world_size, network, projected, first.batch_size)
        measured_step = statistics.fmean(m.step_s for m in runs)
        reached = [m.time_to_target_s for m in runs if not math.isnan(m.time_to_target_s)]
        measured_ttt = statistics.fmean(reached) if len(reached) == len(runs) else math.nan
        rows.append({"method": calibration.model.method, "workload": calibration.workload, "label": label,
                     "calibrated_on": calibration.model.label, "world_size": world_size,
                     "network": network or "loopback", "seeds": len(runs), "measured_step_s": measured_step,
                     "projected_step_s": out["step_time_s"], "step_error": out["step_time_s"] / measured_step - 1,
                     "measured_time_to_target_s": measured_ttt, "projected_time_to_target_s": out["time_to_target_s"],
                     "time_to_target_error": out["time_to_target_s"] / measured_ttt - 1,
                     **terms(calibration, runs, projected, world_size), "note": out["note"]})
    return pd.DataFrame(rows)


def error_summary(validation: pd.DataFrame) -> dict[str, float]:
    """Median and max absolute relative error of step time (and time to target where both exist), and counts."""
    step = validation["step_error"].abs().dropna() if len(validation) else pd.Series(dtype=float)
    ttt = validation["time_to_target_error"].abs().dropna() if len(validation) else pd.Series(dtype=float)
    return {"configurations": int(len(step)), "median_step_error": float(step.median()) if len(step) else math.nan,
            "max_step_error": float(step.max()) if len(step) else math.nan,
            "median_time_to_target_error": float(ttt.median()) if len(ttt) else math.nan,
            "max_time_to_target_error": float(ttt.max()) if len(ttt) else math.nan}
