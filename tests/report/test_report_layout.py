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


def test_time_to_target_bars_stand_on_a_linear_axis_and_long_labels_wrap() -> None:
    import pandas as pd

    from harness.report.figures import TICK_CHARACTERS, plot_time_to_target

    long = "sgd batch_size=16 lr=0.003 lr_warmup_steps=15 momentum=0 x1"
    table = pd.DataFrame({"label": [long] * 3 + ["ddp x2"] * 3, "workload": ["w"] * 6, "seed": [0, 1, 2] * 2,
                          "time_to_target_s": [1.0, 1.2, 1.1, 40.0, 41.0, 42.0]})  # more than a decade apart
    fig = plot_time_to_target(table, 0.9)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and "log" not in ax.get_xlabel()
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert all(len(line) <= TICK_CHARACTERS for tick in ticks for line in tick.splitlines())
    assert "\n" in ticks[0]


def test_the_page_ends_with_a_glossary_that_the_docs_also_define():
    """The page defines the words it uses before explaining them (label, bubble, 1F1B, censored time...), linked from
    its top; docs/glossary.md, which the README links to, defines each of them too."""
    from pathlib import Path

    from harness.report.glossary import TERMS, glossary_html

    section = glossary_html()
    assert section.startswith('<h2 id="glossary">') and all(term in section for term in TERMS)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "glossary.md").read_text().lower()
    assert [term for term in TERMS if f"**{term.lower()}" not in docs] == []
