"""The scaling plot: each row's y-axis names its own measure, and an accuracy spread of a few tenths of a point does
not fill the panel."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from harness.report.scaling import ACCURACY_SPAN, MEASURES, plot_scaling, scaling_rows  # noqa: E402


def rows() -> pd.DataFrame:
    """pipedream at 2 and 3 ranks on one workload, 2 seeds each: accuracies within 0.006 of each other."""
    data = [{"method": "pipedream", "workload": "digits-mlp", "network": "", "label": f"pipedream x{w}",
             "world_size": w, "seed": s, "time_to_target_s": 3.0 + w + s, "final_accuracy": 0.972 + 0.003 * s}
            for w in (2, 3) for s in (0, 1)]
    data.append({"method": "sgd", "workload": "digits-mlp", "network": "", "label": "sgd x1", "world_size": 1,
                 "seed": 0, "time_to_target_s": 2.0, "final_accuracy": 0.97})
    return scaling_rows(pd.DataFrame(data))


def test_each_row_is_labelled_by_its_measure_not_by_the_last_line() -> None:
    table = rows()
    assert set(table["method"]) == {"pipedream"}  # sgd ran at one world size only
    fig = plot_scaling(table)
    axes = fig.axes[:len(MEASURES)]
    assert [ax.get_ylabel() for ax in axes] == [name for _, name in MEASURES]
    assert axes[0].get_legend_handles_labels()[1] == ["pipedream"]
    low, high = axes[1].get_ylim()
    assert high - low >= ACCURACY_SPAN - 1e-9 and 0.0 <= low < 0.972 and 0.975 < high <= 1.0
