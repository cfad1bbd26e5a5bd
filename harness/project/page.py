"""The projection's page: per configuration, its projected step time and time to target against world size, each
figure labelled a projection, with how far projections of its method were off on held-out runs beside it."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from harness.project.progress import phase
from harness.project.tables import TTT_ASSUMPTION
from harness.report.csvfile import read_csv
from harness.report.figures import new_figure, note
from harness.report.page import CSS, table_html

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PAGE = "projection.html"
#: A row's note reads left to right.
ROWS_CSS = ".rows td:last-child, .rows th:last-child { text-align: left; }"


def read_validation(path: Path) -> pd.DataFrame:
    """A projection_validation.csv, or the one in a results folder's report/ (a suite folder or its report);
    ValueError (one line) when there is none or it lacks the columns the page needs."""
    for candidate in (path, path / "projection_validation.csv", path / "report" / "projection_validation.csv"):
        if candidate.is_file():
            frame = read_csv(candidate)
            missing = {"method", "world_size", "network", "step_error"} - set(frame.columns)
            if missing:
                raise ValueError(f"{candidate}: no {', '.join(sorted(missing))} column (written by an older dtbench "
                                 "project --validate: run it again)")
            return frame.assign(source=str(candidate))
    raise ValueError(f"--validation {path}: no projection_validation.csv there (run dtbench project --validate on "
                     "a suite with held-out runs, e.g. suites/projection-ranks.toml)")


def method_errors(validation: pd.DataFrame | None) -> dict[str, dict]:
    """Per method: the held-out configurations, their world sizes and networks, and the median and max |step
    error| (and time to target's where measured)."""
    if validation is None or validation.empty:
        return {}
    out = {}
    for method, group in validation.dropna(subset=["step_error"]).groupby("method"):
        step = group["step_error"].abs()
        ttt = group["time_to_target_error"].abs().dropna() if "time_to_target_error" in group else pd.Series()
        out[str(method)] = {
            "configurations": len(group), "world_sizes": sorted(int(n) for n in group["world_size"].unique()),
            "networks": list(dict.fromkeys(str(n) for n in group["network"])),
            "median": float(step.median()), "max": float(step.max()),
            "ttt_median": float(ttt.median()) if len(ttt) else math.nan,
            "workloads": sorted(str(w) for w in group.get("workload", pd.Series(dtype=str)).dropna().unique()),
            "source": str(group["source"].iloc[0]) if "source" in group else ""}
    return out


def plot_configuration(rows: pd.DataFrame, title: str) -> Figure:
    """One configuration's projection rows -> step time and time to target against world size (log-log), one line
    per network, titled as a projection."""
    fig = new_figure(9.0, 3.6)
    step_ax, ttt_ax = fig.subplots(1, 2)
    for network, group in rows.groupby("network", sort=False):
        group = group.sort_values("world_size")
        step_ax.plot(group["world_size"], group["step_time_s"], marker="o", label=str(network))
        ttt_ax.plot(group["world_size"], group["time_to_target_s"], marker="o", label=str(network))
    for ax, what in ((step_ax, "step time (s)"), (ttt_ax, "time to target (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("world size (ranks, one per node)")
        ax.set_ylabel(f"projected {what}")
        column = "step_time_s" if ax is step_ax else "time_to_target_s"
        if rows[column].astype(float).gt(0).any():
            ax.set_yscale("log")
            ax.legend(fontsize="small", title="link")
        else:
            note(ax, "not projected" if ax is step_ax else "no time to target\n(the calibration runs never "
                 "reached it,\nor another batch)")
    fig.suptitle(f"PROJECTION (not measured): {title}", fontsize=11)
    return fig


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def validation_text(method: str, errors: dict[str, dict]) -> str:
    """What the held-out runs said about projections of `method`, as HTML."""
    e = html.escape
    found = errors.get(method)
    if found is None:
        return (f"<p><b>Not validated</b>: no held-out run of {e(method)} was compared with its projection. "
                "Treat these numbers as the model's, untested for this method.</p>")
    ttt = "" if math.isnan(found["ttt_median"]) else f"; time to target median {found['ttt_median']:.0%}"
    return (f"<p><b>Validation</b> of {e(method)}'s projections on held-out runs: step time off by "
            f"<b>{found['median']:.0%} median, {found['max']:.0%} max</b>{ttt}, over {found['configurations']} "
            f"configurations ({e(', '.join(str(n) for n in found['world_sizes']))} ranks; "
            f"{e(', '.join(found['networks']))}"
            + (f"; {e(', '.join(found['workloads']))}" if found["workloads"] else "")
            + f").</p><p class=\"meta\">from {e(found['source'])}</p>")


#: What a method's paper claims about speed where this machine cannot show it: shown beside its projection, labelled
#: as the paper's, never as a measurement (docs/claims.md's cluster claims).
PAPER_CLAIMS = {
    "apapo": (2.8, "APapo's abstract (Liu and Ju 2024, FGCS) claims a 2.8x average training speed-up over existing "
                   "parallel optimization methods at unchanged accuracy. It cannot show on 2 shared CPU cores "
                   "(suites/apapo.claims.toml and suites/apapo-memory.claims.toml judge it as a cluster claim)."),
}


def paper_claim_text(method: str, rows: pd.DataFrame) -> str:
    """The paper's speed-up claim for `method`, if it has one, beside what this projection says of the same ratio
    (its throughput over the workload's baseline), both labelled for what they are."""
    found = PAPER_CLAIMS.get(method)
    if found is None:
        return ""
    claimed, text = found
    speedups = pd.to_numeric(rows["speedup"], errors="coerce").dropna()
    projected = (f"This projection's speed-up over the workload's baseline: {speedups.min():.2f}x to "
                 f"{speedups.max():.2f}x across its world sizes and networks (projected, not measured)."
                 if len(speedups) else "This projection has no baseline on the workload to compare with.")
    return (f"<p><b>Paper's claim, {claimed:g}x (not measured here)</b>: {html.escape(text, quote=False)} "
            f"{html.escape(projected, quote=False)}</p>")


def render(table: pd.DataFrame, errors: dict[str, dict], heading: str, shown_sizes: list[int]) -> str:
    """The page: a heading saying what was calibrated and assumed, then per configuration its figure with the
    validation beside it and its rows at `shown_sizes`."""
    e = html.escape
    sections = []
    for (workload, label), rows in phase(table.groupby(["workload", "label"], sort=False), "page figures", "figure"):
        method = str(rows["method"].iloc[0])
        fig = plot_configuration(rows, f"{label} on {workload}")
        at = rows[rows["world_size"].isin(shown_sizes)][
            ["world_size", "network", "step_time_s", "time_to_target_s", "speedup", "bubble", "note"]]
        sections.append(
            f'<section><h2>{e(label)} <span class="meta">({e(workload)})</span></h2>'
            '<div class="plots" style="align-items: flex-start; flex-wrap: nowrap">'
            f'<figure style="flex: 0 1 900px"><img alt="projection of {e(label)}" '
            f'src="data:image/png;base64,{_png(fig)}">'
            f"<figcaption>Projection, not a measurement: {e(label)} on {e(workload)}.</figcaption></figure>"
            '<div class="warning" style="flex: 1 1 280px; max-width: 420px">'
            f"{validation_text(method, errors)}{paper_claim_text(method, rows)}</div></div>"
            + '<div class="rows">' + table_html(at.fillna({"note": ""})) + "</div></section>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Projection</title>"
            f"<style>{CSS}{ROWS_CSS}</style></head><body>"
            "<h1>Projection: step time and time to target beyond this machine</h1>"
            f'<p class="warning">Every number on this page is a <b>projection</b> by dtbench project '
            f"(docs/projection.md), not a measurement. {e(heading)} {e(TTT_ASSUMPTION)}.</p>"
            + "\n".join(sections) + "</body></html>\n")


def write_page(table: pd.DataFrame, validation: pd.DataFrame | None, heading: str, out: Path,
               shown_sizes: list[int]) -> Path:
    """Write projection.html to `out` (self-contained: figures as data: URIs) and return its path."""
    path = out / PAGE
    path.write_text(render(table, method_errors(validation), heading, shown_sizes), encoding="utf-8")
    return path
