"""The gantt chart and the time-to-target bars: long labels wrap inside the figure instead of being clipped,
and bars stand on a linear axis."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from harness.report import pipeline  # noqa: E402
from harness.results import RunResult, metrics_frame  # noqa: E402


def test_a_long_label_wraps_inside_the_figure() -> None:
    first = [["forward", 0, 0, 1, 0, 0], ["backward", 0, 3, 4, 0, 0], ["update", -1, 4, 4.2, 0, 0]]
    last = [["forward", 0, 1, 2, 0, 1], ["backward", 0, 2, 3, 0, 1], ["update", -1, 3, 3.2, 0, 1]]
    records = [{"kind": "trace", "rank": r, "step": 1, "worker": r, "events": events}
               for r, events in enumerate((first, last))]
    label = "gpipe batch_size=16 lr=0.003 lr_warmup_steps=15 momentum=0 microbatches=4 optimizer=adamw x2"
    run = RunResult(Path("gpipe"), {"method": "gpipe", "world_size": 2, "seed": 0, "label": label,
                                    "params": {"microbatches": 1}}, None, None, metrics_frame(records))
    figure = pipeline.plot_gantt(run)
    title = figure.axes[0].title
    assert "\n" in title.get_text() and all(len(line) <= pipeline.GANTT_TITLE_CHARACTERS
                                            for line in title.get_text().splitlines())
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    figure.savefig(io.BytesIO(), format="png")  # lay it out as the report does
    box = title.get_window_extent(renderer=canvas.get_renderer())
    width = figure.get_size_inches()[0] * figure.dpi
    assert box.x0 >= 0 and box.x1 <= width


def test_time_to_target_survival_shows_times_decades_apart_on_a_log_axis() -> None:
    """One label 40x slower than another (pb's 38.8 s beside 1 s): on a log axis both steps stay readable."""
    import pandas as pd

    from harness.report.figures import plot_time_to_target_survival

    table = pd.DataFrame({"label": ["fast x1"] * 3 + ["slow x2"] * 3, "workload": ["w"] * 6, "seed": [0, 1, 2] * 2,
                          "state": "completed", "time_to_target_s": [1.0, 1.2, 1.1, 40.0, 41.0, 42.0],
                          "train_time_s": [2.0] * 3 + [50.0] * 3})
    ax = plot_time_to_target_survival(table, 0.9).axes[0]
    low, high = ax.get_xlim()
    assert ax.get_xscale() == "log" and "log scale" in ax.get_xlabel()
    assert low <= 1.0 and high >= 42.0 and high / low < 200  # both labels' steps, and not much else


def test_the_page_ends_with_a_glossary_that_the_docs_also_define():
    """The page defines the words it uses before explaining them (label, bubble, 1F1B, censored time...), linked from
    its top; docs/glossary.md, which the README links to, defines each of them too."""
    from pathlib import Path

    from harness.report.glossary import TERMS, glossary_html

    section = glossary_html()
    assert section.startswith('<h2 id="glossary">') and all(term in section for term in TERMS)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "glossary.md").read_text().lower()
    assert [term for term in TERMS if f"**{term.lower()}" not in docs] == []
