"""The report's self-contained HTML page: inline CSS, escaped tables, and images as data: URIs."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence

import pandas as pd

from harness.report.tables import AGGREGATED

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; } .plots figure { margin: 0; }
.plots img { max-width: 100%; width: 760px; border: 1px solid #eee; }
.failure { color: #a00; }
"""

def _mean_ci_text(mean: float, half: float, n: int, digits: str = ".4g") -> str:
    """(0.91234, 0.0123, 2) -> '0.9123 ± 0.0123 (n=2)'; '–' when there is no value."""
    if n == 0 or not math.isfinite(mean):
        return "–"
    text = format(mean, digits)
    if math.isfinite(half):
        text += " ± " + format(half, digits)
    return f"{text} (n={n})"

def aggregate_display(aggregates: pd.DataFrame) -> pd.DataFrame:
    """aggregate (labels x columns) -> the same as text: 'mean ± 95% CI half-width (n=…)' per metric."""
    shown = pd.DataFrame({"label": aggregates["label"], "runs": aggregates["runs"],
                          "completed": aggregates["completed"]})
    for metric, name in AGGREGATED.items():
        shown[name] = [_mean_ci_text(row[f"{metric}_mean"], row[f"{metric}_ci95"], row[f"{metric}_n"])
                       for _, row in aggregates.iterrows()]
    shown["reached target"] = [f"{row['time_to_target_s_n']}/{row['used']}"
                               for _, row in aggregates.iterrows()]
    return shown

def table_html(frame: pd.DataFrame) -> str:
    """A DataFrame as an HTML table with every cell and header escaped."""
    return frame.to_html(index=False, escape=True, na_rep="", border=0,
                         float_format=lambda value: format(value, ".4g"))

def render_html(suite: str, generated: str, table: pd.DataFrame, aggregates: pd.DataFrame,
                failed: pd.DataFrame, images: dict[str, bytes], scope: str, sections: Sequence[str] = (),
                baseline: tuple[str, str] | None = None) -> str:
    """What the page shows -> one self-contained HTML page (inline CSS, images as data: URIs, no links).

    `sections`: HTML sections placed after the per-label table (e.g. network.network_html), in order.
    `baseline`: (label, how it was chosen), named at the top of the page.
    """
    e = html.escape
    figures = "\n".join(
        f'<figure><img alt="{e(name)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        f"<figcaption>{e(name)}</figcaption></figure>"
        for name, png in images.items()
    )
    if failed.empty:
        failures_html = "<p>Every run completed.</p>"
    else:
        items = "\n".join(
            f'<li class="failure"><b>{e(str(row.run_id))}</b> ({e(str(row.label))}): {e(str(row.state))}'
            + ("" if pd.isna(row.rank) else f", rank {e(str(row.rank))}")
            + (f": {e(str(row.message))}" if row.message else "") + "</li>"
            for row in failed.itertuples()
        )
        failures_html = f"<ul>\n{items}\n</ul>"
    completed = int((table["state"] == "completed").sum())
    baseline_html = (f" Baseline for comparisons: <b>{e(baseline[0])}</b> ({e(baseline[1])})." if baseline else "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dtbench report: {e(suite)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>dtbench report: {e(suite)}</h1>
<p class="meta">Generated {e(generated)}. {len(table)} runs, {completed} completed.{baseline_html}</p>
<h2>Per label (mean over seeds)</h2>
<p>± is the half-width of the 95% Student-t confidence interval over seeds; n counts the runs with a value.
{e(scope)}</p>
{table_html(aggregate_display(aggregates))}
{"".join(sections)}<h2>Plots</h2>
<p>Bands and error bars are seaborn's 95% bootstrap confidence intervals over seeds.</p>
<div class="plots">
{figures}
</div>
<h2>Runs that did not complete</h2>
{failures_html}
<h2>All runs (summary.csv)</h2>
{table_html(table)}
</body>
</html>
"""
