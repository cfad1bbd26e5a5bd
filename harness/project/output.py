"""Writing a projection: projection.csv and .png, the validation's CSV and plot, and the tables printed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from harness.project.crossover import crossover_table
from harness.project.figures import plot_projection, plot_validation
from harness.project.page import read_validation, write_page
from harness.project.suite import Settings, calibrate_suite
from harness.project.tables import (
    TTT_ASSUMPTION,
    choose_baseline,
    error_summary,
    projection_table,
    validation_table,
)
from harness.report.csvfile import write_csv


def cell(spec: str, suffix: str = "") -> Callable[[float], str]:
    """A cell's text: format(value, spec) + suffix, '-' for NaN."""
    return lambda value: "-" if value != value else format(value, spec) + suffix


seconds, percent, share = cell(".4g"), cell("+.1%"), cell(".0%")


def write_projection(suite_dir: Path, out: Path, settings: Settings, world_sizes: Sequence[int],
                     networks: Sequence[str], baseline: str | None, validate: bool, reprofile: bool,
                     validation_from: Path | None = None) -> None:
    """Calibrate, project, write and print, and the page (projection.html) with each method's validation beside
    its figures: this suite's held-out runs with `validate`, else `validation_from`'s projection_validation.csv.
    ValueError (one line) when nothing can be calibrated or validation_from has no validation; nothing is written
    then but the block-cost cache."""
    outside = read_validation(validation_from) if validation_from is not None else None
    suite = calibrate_suite(suite_dir, settings, out, reprofile)
    chosen = choose_baseline(suite, baseline)
    table = projection_table(suite, world_sizes, networks, settings, chosen)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(table, out / "projection.csv")
    plot_projection(table, chosen).savefig(out / "projection.png", dpi=110)
    where = suite.network or "loopback"
    print(f"Calibrated on {where} at {suite.world_size} ranks: {len(suite.calibrations)} configurations "
          f"({sum(len(c.runs) for c in suite.calibrations)} runs). Links: B = rate x {settings.efficiency:.3f} "
          f"payload, unshaped {settings.unshaped_rate_bps / 1e9:g} Gbit/s, alpha {settings.latency_s * 1e6:g} us.")
    for line in suite.notes:
        print(f"  note: {line}")
    shown = table.assign(**{c: table[c].map(seconds) for c in (
        "step_time_s", "time_to_target_s", "compute_s", "compression_s", "exposed_comm_s", "bubble_s", "other_s")},
        samples_per_s=table["samples_per_s"].map(cell(".0f")), speedup=table["speedup"].map(cell(".2f", "x")),
        bubble=table["bubble"].map(share))
    print(shown.drop(columns=["method", "batch_size"]).to_string(index=False))
    print(f"Assumption: {TTT_ASSUMPTION}. Speed-up: throughput over its workload's baseline's ({chosen} where it "
          "ran, else the workload's first ddp).")
    crossovers = crossover_table(suite, world_sizes, settings, chosen)
    if len(crossovers):
        write_csv(crossovers, out / "projection_crossover.csv")
        print("Link rates where a configuration's projected throughput (and time to target) crosses its workload's "
              "baseline's (it pays below the rate when faster_at_slowest):")
        print(crossovers.to_string(index=False))
    print(f"written: {out / 'projection.csv'}, {out / 'projection.png'}"
          + (f", {out / 'projection_crossover.csv'}" if len(crossovers) else ""))
    validation = write_validation(suite, settings, out) if validate else None
    if validation is None or validation.empty:
        validation = outside
    heading = (f"Calibrated on {where} at {suite.world_size} ranks ({len(suite.calibrations)} configurations); "
               f"projected onto links of {', '.join(networks)} (payload {settings.efficiency:.3f} of the rate, "
               f"latency {settings.latency_s * 1e6:g} us), one rank per node.")
    page = write_page(table, validation, heading, out, list(world_sizes))
    print(f"written: {page}" + ("" if validation is not None else " (no validation: pass --validation with a "
                                "suite's projection_validation.csv, e.g. results/projection-ranks)"))


def write_validation(suite, settings: Settings, out: Path) -> pd.DataFrame:
    validation = validation_table(suite, settings)
    write_csv(validation, out / "projection_validation.csv")
    plot_validation(validation).savefig(out / "projection_validation.png", dpi=110)
    if validation.empty:
        print("validation: no held-out run (every run is on the calibration network and world size)")
        return validation
    columns = ["label", "world_size", "network", "measured_step_s", "projected_step_s", "step_error",
               "measured_time_to_target_s", "projected_time_to_target_s", "time_to_target_error"]
    terms = [c for c in ("measured_compression_s", "projected_compression_s", "measured_comm_s", "projected_comm_s",
                         "measured_busy_s", "projected_busy_s", "measured_bubble", "projected_bubble")
             if c in validation.columns]
    shown = validation[columns + terms].copy()
    for column in shown.columns:
        if column.endswith("_error"):
            shown[column] = shown[column].map(percent)
        elif column.endswith("_s"):
            shown[column] = shown[column].map(seconds)
        elif column.endswith("bubble"):
            shown[column] = shown[column].map(share)
    print("Validation on held-out runs (error = projected / measured - 1):")
    print(shown.to_string(index=False))
    summary = error_summary(validation)
    unprojected = len(validation) - summary["configurations"]
    if summary["configurations"]:
        print(f"{summary['configurations']} held-out configurations: step time |error| median "
              f"{summary['median_step_error']:.1%}, max {summary['max_step_error']:.1%}; time to target median "
              f"{summary['median_time_to_target_error']:.1%}, max {summary['max_time_to_target_error']:.1%}"
              + (f" ({unprojected} more could not be projected: see their notes)" if unprojected > 0 else ""))
    else:
        print(f"no held-out configuration could be projected ({len(validation)} tried: see their notes)")
    print(f"written: {out / 'projection_validation.csv'}, {out / 'projection_validation.png'}")
    return validation
