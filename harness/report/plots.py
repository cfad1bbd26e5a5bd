"""The report's Plots section: which figures a suite gets, each with the caption under it, and their HTML."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from harness.report import comparisons, figures, local, pipeline, resources, scaling, stats, styles, tables
from harness.results import RunResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class Plot:
    """One figure of the report: its file name, the figure, and the caption printed under it ('' for none)."""

    name: str
    figure: Figure
    caption: str = ""


def _seeds(rows: pd.DataFrame) -> str:
    """'seed 1' or 'seeds 0, 2'."""
    seeds = [str(s) for s in rows["seed"]]
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(seeds)


def left_out(table: pd.DataFrame, used_table: pd.DataFrame, value: str | None = None, why: str = "") -> str:
    """The caption naming every run a plot leaves out, with why: the runs that did not complete (by label, their
    states), and with `value`, the used runs without a finite one (`why`, e.g. 'never reached the target') or
    with one beyond what a plot can show (figures.PLOTTABLE);
    '' when none is left out."""
    parts = []
    if len(used_table) < len(table):
        for label, group in table[table["state"] != "completed"].groupby("label", sort=False):
            parts.append(f"{label} ({_seeds(group)}: {tables.not_completed(group)})")
    if value is not None and value in used_table.columns:
        values = pd.to_numeric(used_table[value], errors="coerce").astype(float)
        for label, group in used_table[~np.isfinite(values)].groupby("label", sort=False):
            parts.append(f"{label} ({_seeds(group)}: {why or 'no ' + value})")
        huge = np.isfinite(values) & ~figures.plottable(values)
        for label, group in used_table[huge].groupby("label", sort=False):
            parts.append(f"{label} ({_seeds(group)}: {value} beyond {figures.PLOTTABLE:g}, which no axis can show)")
    return "Not shown: " + "; ".join(parts) + "." if parts else ""


#: The file name of the time-to-target survival figure.
SURVIVAL = "time_to_target_survival.png"


def survival_caption(table: pd.DataFrame) -> str:
    """The caption of the survival figure: how to read it, which labels have seeds that never arrived (a curve that
    ends below 1), and the runs it leaves out (failed or preempted, or without a train time)."""
    rows = figures.survival_rows(table)
    tick, missed = figures.CENSOR_MARKS["missed"]
    cross, diverged = figures.CENSOR_MARKS["diverged"]
    text = ("Kaplan–Meier estimate per label of the fraction of its seeds at the target against train time (log "
            "axis): each step up is a seed reaching the target. A run that missed the target is censored at its "
            f"train time, marked {tick} on its curve. A diverged run never reaches the target: it counts as a seed "
            f"that never arrived (censored at +inf), marked {cross} at the time it diverged. A curve that ends below 1 "
            "has seeds that never arrived.")
    short = []
    for (workload, label), group in rows.groupby(["workload", "label"], sort=False):
        if not group["reached"].all():
            counts = [f"{(group['mark'] == mark).sum()} {word}" for mark, word in
                      (("missed", "missed"), ("diverged", "diverged")) if (group["mark"] == mark).any()]
            where = f" on {workload}" if table["workload"].nunique() > 1 else ""
            short.append(f"{label}{where} ({int(group['reached'].sum())} of {len(group)} reached; "
                         f"{', '.join(counts)})")
    if short:
        text += " Seeds that never arrived: " + "; ".join(short) + "."
    gone = table[~table["run_id"].isin(set(rows["run_id"]))]
    parts = [f"{label} ({_seeds(group)}: {tables.not_completed(group) or 'no train time recorded'})"
             for label, group in gone.groupby("label", sort=False)]
    if parts:
        text += " Not shown: " + "; ".join(parts) + "."
    return text


def _target_texts(runs: list[RunResult]) -> dict[str, str]:
    """{workload: 'target accuracy 0.95' or 'target loss 2.9'} for the workloads whose runs share a target."""
    by_workload: dict[str, list[RunResult]] = {}
    for run in runs:
        by_workload.setdefault(str(run.spec.get("workload")), []).append(run)
    texts = {}
    for workload, members in by_workload.items():
        common = tables.common_target_of(members)
        if common is not None:
            texts[workload] = f"target {common[0]} {common[1]:g}"
    return texts


def suite_plots(runs: list[RunResult], used: list[RunResult], table: pd.DataFrame, used_table: pd.DataFrame,
                robust: pd.DataFrame, baseline: str, profile: pd.DataFrame | None,
                few_seeds: bool = False, interval: str = stats.CI_WORDS) -> list[Plot]:
    """The figures of a suite's report, in page order. `runs`/`table`: every run; `used`/`used_table`: those the
    aggregates use (the completed runs, or all when none completed); `robust`: comparisons.robust_table;
    `profile`: comparisons.algoperf's performance profile, or None (no score); `few_seeds`: leave out the probability
    of improvement, which says nothing with fewer than 3 runs a label (page.small_sample_html); `interval`: what
    the titles call the intervals (stats.interval_words). Legends and bars follow the order of used_table (the
    rankings')."""
    target = tables.common_target(runs)
    look = styles.label_styles(table.sort_index())  # in load order: a label keeps its colour whatever its rank
    place = {run_id: position for position, run_id in enumerate(used_table["run_id"])}
    used = sorted(used, key=lambda run: place.get(run.spec.get("run_id") or run.run_dir.name, len(place)))
    missing = left_out(table, used_table)
    readings = tables.readings(runs)
    by_accuracy = [run for run in used if readings.get(str(run.spec.get("workload"))) != "loss"]
    by_loss = [run for run in used if readings.get(str(run.spec.get("workload"))) == "loss"]
    plots = []
    if by_accuracy:  # a language model's panel would be next-token accuracy over a sliver of an epoch: left out
        plots += [
            Plot("accuracy_vs_time.png", figures.plot_accuracy(tables.curves(by_accuracy, "train_time_s"),
                                                               tables.X_AXES["train_time_s"], target, look,
                                                               interval=interval), missing),
            Plot("accuracy_vs_epoch.png", figures.plot_accuracy(tables.curves(by_accuracy, "epoch"),
                                                                tables.X_AXES["epoch"], target, look,
                                                                interval=interval), missing),
        ]
    if by_loss:  # read by held-out loss: against train time and against the tokens trained on
        common = tables.common_target_of(by_loss)
        loss_target = common[1] if common and common[0] == "loss" else None
        for x, name in (("train_time_s", "heldout_loss_vs_time.png"), ("tokens", "heldout_loss_vs_tokens.png")):
            plots.append(Plot(name, figures.plot_accuracy(
                tables.curves(by_loss, x, y="test_loss"), tables.X_AXES[x], loss_target, look, y="test_loss",
                y_label="held-out loss (nats per token)", what="Held-out loss", interval=interval), missing))
    loss = tables.curves(used, "train_time_s", y="loss")
    if not loss.empty:
        plots.append(Plot("loss_vs_time.png", figures.plot_accuracy(
            loss, tables.X_AXES["train_time_s"], None, look, y="loss", y_label="training loss (last stage)",
            what="Training loss", interval=interval), missing))
    plots += [
        Plot(SURVIVAL, figures.plot_time_to_target_survival(table, target, look, _target_texts(runs)),
             survival_caption(table)),
        Plot("bytes_per_sample.png", figures.plot_bytes_per_sample(used_table, look, interval),
             left_out(table, used_table, "bytes_per_sample", "no bytes or samples recorded")),
        Plot("throughput.png", resources.plot_throughput(used_table, look, interval,
                                                         {w for w, r in readings.items() if r == "loss"}),
             left_out(table, used_table, "samples_per_s", "no samples or train time recorded")),
    ]
    memory = resources.rank_memory(used)
    if not memory.empty:
        without = used_table[~used_table["run_id"].isin(set(memory["run_id"]))]
        floor = memory["peak_rss_bytes"].min() / 1e6
        caption = (f"Peak RSS counts the interpreter, torch and the data as well as the model (the smallest rank here: "
                   f"{floor:,.0f} MB), so small models differ little"
                   + ("; a pipeline's stage bytes are in the Pipelines table. " if (used_table["family"] == "pipeline")
                      .any() else ". ") + left_out(table, used_table)).strip()
        if len(without):
            caption = (caption + " " if caption else "") + f"No memory records: {', '.join(without['run_id'])}."
        plots.append(Plot("peak_memory.png", resources.plot_peak_memory(memory, interval), caption))
    varied = scaling.scaling_rows(used_table)
    if not varied.empty:
        plots.append(Plot("scaling.png", scaling.plot_scaling(varied, look, interval),
                          " ".join(part for part in (scaling.scaling_caption(varied), missing) if part)))
    improvement = comparisons.improvement_long(robust)
    if not improvement.empty and not few_seeds:
        plots.append(Plot("improvement.png", figures.plot_improvement(improvement, baseline, look), missing))
    if profile is not None and used_table["workload"].nunique() > 1:
        plots.append(Plot("performance_profile.png", figures.plot_performance_profile(
            profile, styles.label_styles(used_table.assign(
                label=comparisons.with_keys(used_table)["method_label"])))))
    heads = local.head_accuracies(used)
    if not heads.empty:
        plots.append(Plot("head_accuracy.png", local.plot_head_accuracy(heads, look, interval), missing))
    plots += [Plot(name, fig) for name, fig in pipeline.gantt_figures(used).items()]
    return plots


def figures_html(images: dict[str, bytes], captions: dict[str, str]) -> str:
    """The Plots section's figures: each PNG as a data: URI, its file name and its caption (escaped) under it."""
    e = html.escape
    return "\n".join(
        f'<figure><img alt="{e(name)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        f"<figcaption><b>{e(name)}</b>" + (f". {e(captions[name])}" if captions.get(name) else "")
        + "</figcaption></figure>"
        for name, png in images.items()
    )


