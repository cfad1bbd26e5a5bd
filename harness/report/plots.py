"""The report's Plots section: which figures a suite gets, each with the caption under it, and their HTML."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from harness.report import comparisons, figures, local, pipeline, styles, tables
from harness.results import RunResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class Plot:
    """One figure of the report: its file name, the figure, and the caption printed under it ('' for none)."""

    name: str
    figure: Figure
    caption: str = ""


def suite_plots(runs: list[RunResult], used: list[RunResult], table: pd.DataFrame, used_table: pd.DataFrame,
                robust: pd.DataFrame, baseline: str, profile: pd.DataFrame | None,
                few_seeds: bool = False) -> list[Plot]:
    """The figures of a suite's report, in page order. `runs`/`table`: every run; `used`/`used_table`: those the
    aggregates use (the completed runs, or all when none completed); `robust`: comparisons.robust_table;
    `profile`: comparisons.algoperf's performance profile, or None (no score); `few_seeds`: leave out the probability
    of improvement, which says nothing with fewer than 3 runs a label (page.small_sample_html)."""
    target = tables.common_target(runs)
    look = styles.label_styles(table)
    plots = [
        Plot("accuracy_vs_time.png", figures.plot_accuracy(tables.curves(used, "train_time_s"),
                                                           tables.X_AXES["train_time_s"], target, look)),
        Plot("accuracy_vs_epoch.png", figures.plot_accuracy(tables.curves(used, "epoch"), tables.X_AXES["epoch"],
                                                            target, look)),
        Plot("time_to_target.png", figures.plot_time_to_target(used_table, target, look)),
        Plot("bytes_per_sample.png", figures.plot_bytes_per_sample(used_table, look)),
    ]
    improvement = comparisons.improvement_long(robust)
    if not improvement.empty and not few_seeds:
        plots.append(Plot("improvement.png", figures.plot_improvement(improvement, baseline, look)))
    if profile is not None and used_table["workload"].nunique() > 1:
        plots.append(Plot("performance_profile.png", figures.plot_performance_profile(
            profile, styles.label_styles(used_table.assign(
                label=comparisons.with_keys(used_table)["method_label"])))))
    heads = local.head_accuracies(used)
    if not heads.empty:
        plots.append(Plot("head_accuracy.png", local.plot_head_accuracy(heads)))
    plots += [Plot(name, fig) for name, fig in pipeline.gantt_figures(used).items()]
    return plots


def figures_html(images: dict[str, bytes], captions: dict[str, str]) -> str:
    """The Plots section's figures: each PNG as a data: URI, its file name and its caption (escaped) under it."""
    e = html.escape
    return "\n".join(
        f'<figure><img alt="{e(name)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        f"<figcaption>{e(name)}" + (f": {e(captions[name])}" if captions.get(name) else "") + "</figcaption></figure>"
        for name, png in images.items()
    )
