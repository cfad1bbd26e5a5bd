"""The local-parallelism part of the report: each chunk's auxiliary head accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from harness.report import stats
from harness.report.figures import legend_outside, new_figure
from harness.report.styles import Style
from harness.report.tables import eval_records
from harness.results import RunResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def head_accuracies(runs: Sequence[RunResult]) -> pd.DataFrame:
    """runs -> one row per (run, chunk) with the final accuracy of each chunk's auxiliary head.

    Read from the last eval record's `head_accuracy` list (written by methods with local losses); runs without it
    contribute nothing. Columns: label, seed, run_id, chunk (1-based), head_accuracy.
    """
    rows = []
    for run in runs:
        evals = eval_records(run.metrics)
        if "head_accuracy" not in evals.columns:
            continue
        heads = [v for v in evals["head_accuracy"] if isinstance(v, list)]
        if heads:
            rows += [{"label": run.label, "seed": run.spec.get("seed"), "run_id": run.run_dir.name, "chunk": c + 1,
                      "head_accuracy": float(a)} for c, a in enumerate(heads[-1])]
    return pd.DataFrame(rows, columns=["label", "seed", "run_id", "chunk", "head_accuracy"])

def plot_head_accuracy(heads: pd.DataFrame, styles: dict[str, Style] | None = None,
                       interval: str = stats.CI_WORDS) -> Figure:
    """head_accuracies (rows) -> bars of each chunk's final head accuracy per label (mean over seeds, 95% CI):
    how the representation improves with depth under local losses."""
    import seaborn as sns

    fig = new_figure()
    ax = fig.subplots()
    labels = [str(label) for label in pd.unique(heads["label"])]
    palette = {k: styles[k].color for k in labels} if styles and all(k in styles for k in labels) else None
    sns.barplot(data=heads.astype({"label": str}), x="chunk", y="head_accuracy", hue="label", hue_order=labels,
                palette=palette, errorbar=stats.bootstrap_ci95, ax=ax)
    ax.set_ylim(0.0, 1.0)  # from 0: bar lengths compare as the accuracies do
    ax.set_xlabel("chunk (input side first)")
    ax.set_ylabel("final test accuracy of the chunk's head (axis from 0)")
    ax.set_title(f"Per-chunk head accuracy (mean over seeds, {interval})")
    for container in ax.containers:
        if hasattr(container, "datavalues"):
            ax.bar_label(container, fmt="%.3f", fontsize="small", label_type="center", color="white")
    legend_outside(fig, [ax])
    return fig
