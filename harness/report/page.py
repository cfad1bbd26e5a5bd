"""The report's self-contained HTML page: inline CSS, escaped tables, and images as data: URIs."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import pandas as pd

from harness.report import stats
from harness.report.glossary import glossary_html
from harness.report.tables import AGGREGATED, SHOWN
from harness.suite.spec import compact

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; }
dl.glossary dt { font-weight: bold; margin-top: 0.5em; } dl.glossary dd { margin-left: 1.5em; max-width: 60em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
#rankings td:nth-child(2), #rankings th:nth-child(2), #per-label td:nth-child(2), #per-label th:nth-child(2) {
  text-align: left; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; } .plots figure { margin: 0; }
.plots img { max-width: 100%; height: auto; border: 1px solid #eee; display: block; box-sizing: border-box; }
.plots figure { max-width: 100%; } figcaption { font-size: 0.85em; color: #444; max-width: 1000px; }
.scroll { max-width: 100%; overflow-x: auto; } .verdict { font-weight: bold; }
.setup { text-decoration: underline dotted; cursor: help; }
.identical { background: #eef4fb; border-left: 4px solid #5b8fc7; padding: 0.4em 0.8em; }
.failure { color: #a00; } .warning { background: #fff4d6; border-left: 4px solid #e0a000; padding: 0.4em 0.8em; }
.PASS { color: #060; font-weight: bold; } .FAIL { color: #a00; font-weight: bold; } .INCONCLUSIVE { color: #666; }
"""

#: What every interval on the page is (harness/report/stats.py).
INTERVAL_NOTE = ("Each interval of a mean on this page is a 95% percentile bootstrap over seeds (2,000 resamples, "
                 "seed 0): of the mean in the tables and plots, stratified by workload for IQM and probability of "
                 "improvement. Speed-ups and claims, paired by seed, take a paired Student-t interval on the log "
                 "ratios (or differences): a bootstrap of 3 pairs is only their range.")
#: The same, when some label has 2 runs or fewer (interval_note).
FEW_SEEDS_NOTE = ("Each interval of a mean on this page is a percentile bootstrap over seeds (2,000 resamples, seed "
                  "0), which with {fewest} is no confidence interval: the tables' and plots' brackets, bands and error "
                  "bars are {words}; a speed-up's paired t interval is very wide on so few pairs. The order of the "
                  "rankings is not a finding: another run of the suite may reorder labels whose ranges overlap.")


def interval_note(interval: str) -> str:
    """The page's sentence on what its intervals are: INTERVAL_NOTE, or FEW_SEEDS_NOTE when `interval`
    (stats.interval_words) says they are ranges."""
    if interval == stats.CI_WORDS:
        return INTERVAL_NOTE
    fewest = "2 runs a label" if interval.startswith("min") else "1 run a label"
    words = "the range from the smaller to the larger run" if interval.startswith("min") else "absent (1 run)"
    return FEW_SEEDS_NOTE.format(fewest=fewest, words=words)


def number_text(value: float, digits: str | None = None) -> str:
    """A number as the page shows it, one way everywhere: 4 significant digits, and from 10,000 up whole with
    thousands separators ('15,936', never '1.594e+04'); `digits` forces a format. '–' when NaN, '∞' for +inf."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value == math.inf:
        return "∞"
    if digits is None:
        digits = ",.0f" if abs(value) >= 1e4 else ".4g"
    return format(value, digits)


def interval_text(value: float, low: float, high: float, n: int | None = None, digits: str | None = None) -> str:
    """(0.91234, 0.90, 0.93, 2) -> '0.9123 [0.9, 0.93] (n=2)'; '–' when there is no value; no interval when NaN."""
    if (n is not None and n == 0) or value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = number_text(value, digits)
    if not (math.isnan(low) or math.isnan(high)):
        text += f" [{number_text(low, digits)}, {number_text(high, digits)}]"
    return text if n is None else f"{text} (n={n})"


def reached_text(row: pd.Series) -> str:
    """An aggregate row's 'reached target' cell: '2/2', or '– (0 of 2 completed: diverged 2)' with no run to count."""
    if row["used"] == 0:
        return f"– (0 of {row['runs']} completed: {row['not_completed']})"
    return f"{row['time_to_target_s_n']}/{row['used']}"


def aggregate_display(aggregates: pd.DataFrame, reading: str = "accuracy") -> pd.DataFrame:
    """aggregate (labels x columns) -> the same as text: 'mean [95% bootstrap CI] (n=…)' per metric that a
    workload read by `reading` shows (tables.SHOWN: a language model's held-out loss and perplexity lead, and it
    has no accuracy column)."""
    shown = pd.DataFrame({"workload": aggregates["workload"], "label": aggregates["label"],
                          "runs": aggregates["runs"], "completed": aggregates["completed"]})
    for metric in SHOWN[reading]:
        name = AGGREGATED[metric]
        shown[name] = [interval_text(row[f"{metric}_mean"], row[f"{metric}_ci_low"], row[f"{metric}_ci_high"],
                                     row[f"{metric}_n"]) for _, row in aggregates.iterrows()]
    shown["reached target"] = [reached_text(row) for _, row in aggregates.iterrows()]
    if "noisy" in aggregates.columns and aggregates["noisy"].sum() > 0:
        shown["noisy runs"] = aggregates["noisy"]
    return shown

def setup_text(spec: dict) -> str:
    """What a run is, in full, for a label's tooltip: method, world size, workload options and every param."""
    def listed(values: object) -> str:
        return ", ".join(f"{k}={compact(v)}" for k, v in sorted(values.items())) if isinstance(values, dict) else ""

    text = f"{spec.get('method')} x{spec.get('world_size')} on {spec.get('workload')}"
    options = listed(spec.get("workload_options"))
    return text + (f" ({options})" if options else "") + f"; params: {listed(spec.get('params')) or 'none'}"


def label_setups(specs: Sequence[dict]) -> dict[tuple[str, str], str]:
    """{(workload, label): setup_text of its first run}: the full params a short label leaves out."""
    out: dict[tuple[str, str], str] = {}
    for spec in specs:
        key = (str(spec.get("workload")), str(spec.get("label") or spec.get("method")))
        out.setdefault(key, setup_text(spec))
    return out


def with_tooltips(shown: pd.DataFrame, setups: dict[tuple[str, str], str]) -> str:
    """table_html of `shown` (a workload and a label column), each label cell carrying its run's full setup as a
    tooltip (a title attribute; every cell still escaped)."""
    cells = shown.copy()
    for column in cells.columns:
        cells[column] = [html.escape(v) if isinstance(v, str) else v for v in cells[column]]
    cells["label"] = [
        f'<span class="setup" title="{html.escape(setups[key])}">{html.escape(key[1])}</span>'
        if key in setups else html.escape(key[1])
        for key in zip(shown["workload"].astype(str), shown["label"].astype(str), strict=True)]
    return '<div class="scroll">' + cells.to_html(index=False, escape=False, na_rep="", border=0,
                                                  float_format=number_text) + "</div>\n"


def per_label_tables(aggregates: pd.DataFrame, readings: dict[str, str],
                     setups: dict[tuple[str, str], str] | None = None, notes: str = "") -> str:
    """The per-label table: one for the workloads read by accuracy and one for those read by held-out loss (each
    under a heading when the suite has both), so no language model shows an accuracy column. `setups` (label_setups)
    gives each label cell its run's full params as a tooltip."""
    kinds = aggregates["workload"].astype(str).map(readings).fillna("accuracy")
    parts = []
    for reading, heading in (("accuracy", "Read by accuracy"), ("loss", "Read by held-out loss (language models)")):
        rows = aggregates[kinds == reading]
        if rows.empty:
            continue
        if kinds.nunique() > 1:
            parts.append(f"<h3>{html.escape(heading)}</h3>\n")
        parts.append(with_tooltips(aggregate_display(rows, reading), setups or {}))
    return "".join(parts)


def table_html(frame: pd.DataFrame) -> str:
    """A DataFrame as an HTML table with every cell and header escaped, in a box that scrolls sideways when the
    table is wider than the page (the page itself never does)."""
    return '<div class="scroll">' + frame.to_html(index=False, escape=True, na_rep="", border=0,
                                                  float_format=number_text) + "</div>\n"


#: Fewer runs than this per label and the page says that its intervals are ranges (small_sample_html).
MIN_SEEDS = stats.MIN_INTERVAL_RUNS


def fewest_runs(aggregates: pd.DataFrame) -> int | None:
    """The fewest runs any label has in the statistics (labels with none left out); None when no label has one."""
    used = aggregates.loc[aggregates["used"] > 0, "used"]
    return int(used.min()) if len(used) else None


def small_sample_html(aggregates: pd.DataFrame) -> str:
    """A warning when some label has fewer than MIN_SEEDS runs: what its intervals then are, and what is hidden."""
    fewest = fewest_runs(aggregates)
    if fewest is None or fewest >= MIN_SEEDS:
        return ""
    few = aggregates[(aggregates["used"] > 0) & (aggregates["used"] < MIN_SEEDS)]
    what = ("each interval is then the range from the smallest to the largest run (a bootstrap of 2 values "
            "resamples only them)" if fewest == 2 else "with 1 run there is no interval at all")
    return (f'<p class="warning"><b>Few seeds.</b> {len(few)} of {len(aggregates)} labels have fewer than '
            f"{MIN_SEEDS} runs (as few as {fewest}): {what}, not a confidence interval. The probability of "
            f"improvement over the baseline (its interval spans nearly [0, 1]) and the MLPerf time (an olympic mean "
            f"of at least 3 runs) are not shown; comparisons.csv keeps their values. Give the suite at least "
            f"{MIN_SEEDS} seeds for intervals that say something.</p>\n")

def _rank(value: object) -> str | None:
    """A failure's rank as status.json means it ('1', not the '1.0' of a column that also holds None), or None."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def failures_html(failed: pd.DataFrame) -> str:
    """The list of runs that did not complete (run_id, label, state, rank, message), each named once, escaped; the
    rank is said once (a message that starts with it says it already)."""
    e = html.escape
    if failed.empty:
        return "<p>Every run completed.</p>"
    items = "\n".join(
        f'<li class="failure"><b>{e(str(row.run_id))}</b> ({e(str(row.label))}): {e(str(row.state))}'
        + ("" if _rank(row.rank) is None or str(row.message or "").startswith(f"rank {_rank(row.rank)} ")
           else f", rank {e(_rank(row.rank))}")
        + (f": {e(str(row.message))}" if row.message else "") + "</li>"
        for row in failed.itertuples()
    )
    return f"<ul>\n{items}\n</ul>"


def render_html(suite: str, generated: str, table: pd.DataFrame, aggregates: pd.DataFrame,
                failed: pd.DataFrame, figures: str, scope: str, sections: Sequence[str] = (),
                baseline: tuple[str, str] | None = None, warnings: Sequence[str] = (), rankings: str = "",
                interval: str = stats.CI_WORDS, readings: dict[str, str] | None = None,
                setups: dict[tuple[str, str], str] | None = None, notes: str = "") -> str:
    """What the page shows -> one self-contained HTML page (inline CSS, images as data: URIs, no links but to its
    own sections), ending with the glossary of the words it uses (harness/report/glossary.py).

    `figures`: the Plots section's figures as HTML (plots.figures_html).
    `sections`: HTML sections placed after the per-label table (e.g. network.network_html), in order.
    `baseline`: (label, how it was chosen), named at the top of the page.
    `warnings`: HTML paragraphs shown right under the title (e.g. hygiene.noisy_html).
    `rankings`: the Rankings section (rankings.rankings_html), placed before every other table.
    `interval`: what the intervals are (stats.interval_words): every sentence that names them says so.
    `readings`: {workload: 'accuracy' | 'loss'} (tables.readings): the per-label table has one part per reading.
    `setups`: {(workload, label): its full setup} (label_setups), the label cells' tooltips.
    `notes`: HTML under the per-label table (comparisons.identical_html: labels tied on every seed).
    """
    ci = "95% bootstrap interval" if interval == stats.CI_WORDS else interval
    e = html.escape
    failures = failures_html(failed)
    completed = int((table["state"] == "completed").sum())
    baseline_html = (f" Baseline for comparisons: <b>{e(baseline[0])}</b> ({e(baseline[1])})." if baseline else "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dtbench report: {e(suite)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>dtbench report: {e(suite)}</h1>
<p class="meta">Generated {e(generated)}. {len(table)} runs, {completed} completed.{baseline_html}</p>
{"".join(warnings)}<p>{e(interval_note(interval))} The words the page uses are defined at its end (<a
href="#glossary">glossary</a>).</p>
{rankings}<section id="per-label">
<h2>Per label (mean over seeds)</h2>
<p>One row per workload and label, in the order of the rankings. Each cell is the mean [{e(ci)}]; n
counts the runs with a value. {e(scope)} A label names what sets its runs apart from the method's other runs on the
workload; hover over it for the full params.</p>
{per_label_tables(aggregates, readings or {}, setups)}{notes}</section>
{"".join(sections)}<h2 id="plots">Plots</h2>
<p>Bands and error bars are the same intervals of the mean over seeds ({e(ci)}). Each label has its own colour
(hues grouped by family: reference, data-parallel, compressed, pipeline, local) and keeps it in every plot; plots
with several workloads draw one panel per workload. Under each plot: the runs it leaves out, with their state.</p>
<div class="plots">
{figures}
</div>
<h2>Runs that did not complete</h2>
{failures}
<h2>All runs (summary.csv)</h2>
{table_html(table)}
{glossary_html()}</body>
</html>
"""
