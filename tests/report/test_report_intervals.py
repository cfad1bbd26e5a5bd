"""What the report calls its intervals: a 95% CI from 3 runs a label, a min–max range with 2 (every plot title and
sentence says so), none with 1; and the rankings say a few-seed order is not significant."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from harness.report import figures, page, rankings, stats  # noqa: E402


@pytest.mark.parametrize(("fewest", "words"), [(None, "95% CI"), (3, "95% CI"), (7, "95% CI"),
                                               (2, "min–max of 2 seeds"), (1, "no interval: 1 seed")])
def test_interval_words(fewest, words) -> None:
    assert stats.interval_words(fewest) == words


def test_plot_titles_and_the_page_note_name_the_interval_they_draw() -> None:
    curves = pd.DataFrame({"label": ["a"] * 4, "seed": [0, 0, 1, 1], "run_id": ["r0", "r0", "r1", "r1"],
                           "x": [0.0, 1.0, 0.0, 1.0], "test_accuracy": [0.1, 0.9, 0.2, 0.8]})
    assert "(mean over seeds, 95% CI)" in figures.plot_accuracy(curves, "epoch")._suptitle.get_text()
    two = figures.plot_accuracy(curves, "epoch", interval=stats.interval_words(2))._suptitle.get_text()
    assert "min–max of 2 seeds" in two and "95%" not in two
    assert page.interval_note("95% CI") == page.INTERVAL_NOTE
    note = page.interval_note(stats.interval_words(2))
    assert "no confidence interval" in note and "95%" not in note and "not a finding" in note


def test_rankings_with_few_seeds_say_the_order_is_not_significant() -> None:
    ranked = pd.DataFrame([{"workload": "w", "network": "", "target_accuracy": 0.9, "rank": 1, "label": "a",
                            "method_label": "a", "runs": 2, "completed": 2, "reached": 2, "time_to_target_s": 1.0,
                            "speedup_vs_baseline": float("nan"), "speedup_ci_low": float("nan"),
                            "speedup_ci_high": float("nan"), "speedup_pairs": 0, "final_accuracy": 0.95,
                            "bytes_per_sample": 0.0, "states": "", "target_loss": float("nan"),
                            "final_loss": float("nan"), "speedup_bound": float("nan"), "speedup_bound_side": ""}])
    assert "Not significant." not in rankings.rankings_html(ranked, "a")
    assert "Not significant." in rankings.rankings_html(ranked, "a", stats.interval_words(2))


def test_numbers_are_written_one_way() -> None:
    assert page.number_text(15936.2) == "15,936" and page.number_text(0.91234) == "0.9123"
    assert page.number_text(float("nan")) == "–" and page.number_text(12.3456) == "12.35"
    html = page.table_html(pd.DataFrame({"bytes": [15936.2, 812.5]}))
    assert "15,936" in html and "e+04" not in html and "812.5" in html
