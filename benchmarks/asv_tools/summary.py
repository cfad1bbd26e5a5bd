"""A static, offline summary of the asv results: the latest run and the history across commits, in markdown and HTML.

    python benchmarks/asv_tools/summary.py [--results-dir .asv/results] [--out .asv/summary] [--machine NAME]
        [--commits 12]

asv's own HTML (`asv publish`) loads its JavaScript from CDNs and stays blank offline; this writes plain files:
`index.md` and `index.html` (one self-contained page, plots embedded), `latest.csv`, `history.csv`, and per
benchmark module `latest_<module>.png` (the latest value of every benchmark and parameter combination) and
`history_<module>.png` (each value over the commits, oldest to newest). Both pages also hold the history as a table:
a row per benchmark and parameter combination, a column per stored commit (the newest `--commits`), where the HTML
marks each value beyond the regression check's factor against the commit before it. One run per commit is kept:
the newest.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import html
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from asv_results import ResultsError, load_results, read_benchmarks, result_files
from regress import DEFAULT_FACTOR, human

HISTORY_COLUMNS = ("commit", "commit_date", "run_at", "file", "benchmark", "module", "function", "params",
                   "value", "unit", "type")
#: Commits shown in the history table by default (the newest; history.csv and the plots keep them all).
TABLE_COMMITS = 12


def load_history(results_dir: str | Path, machine: str | None = None) -> pd.DataFrame:
    """Every results file of one machine -> one row per commit, benchmark and parameter combination.

    machine: asv's machine name; by default the machine of the newest results file. Where one commit has several
    files (several environments), only the newest run counts. Rows are ordered by commit date, then run time;
    `run_at` is the start of the file's last benchmark (UTC). Empty (with HISTORY_COLUMNS) when there are none.
    """
    results_dir = Path(results_dir)
    files = result_files(results_dir, machine)
    if not files:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    machine = machine or files[0].parent.name
    benchmarks = read_benchmarks(results_dir / "benchmarks.json")
    frames = []
    for path in files:
        if path.parent.name != machine:
            continue
        data = json.loads(path.read_text())
        table = load_results(path, benchmarks or None)
        if table.empty:
            continue
        started = table["started_at"].max()
        table["run_at"] = pd.to_datetime(started if math.isfinite(started) else path.stat().st_mtime * 1000,
                                         unit="ms", utc=True)
        table["commit"] = str(data.get("commit_hash", path.name.split("-")[0]))[:8]
        table["commit_date"] = pd.to_datetime(data.get("date") or 0, unit="ms", utc=True)
        table["file"] = str(path)
        frames.append(table)
    if not frames:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    history = pd.concat(frames, ignore_index=True)
    newest = history.groupby("commit")["run_at"].transform("max")
    history = history[history["run_at"] == newest]
    history["module"] = history["benchmark"].str.split(".").str[0]
    history["function"] = history["benchmark"].str.split(".", n=1).str[1]
    history = history.sort_values(["commit_date", "run_at", "benchmark", "params"], kind="stable")
    return history[list(HISTORY_COLUMNS)].reset_index(drop=True)


def commits_in_order(history: pd.DataFrame) -> list[str]:
    """The commits of a history table, oldest first."""
    return list(dict.fromkeys(history["commit"]))


def latest_table(history: pd.DataFrame) -> pd.DataFrame:
    """The newest commit's rows, with the previous commit's value and the ratio (latest / previous) beside them."""
    commits = commits_in_order(history)
    if not commits:
        return pd.DataFrame(columns=["benchmark", "params", "value", "unit", "previous", "ratio"])
    keys = ["benchmark", "params"]
    latest = history[history["commit"] == commits[-1]][keys + ["value", "unit", "type"]]
    if len(commits) > 1:
        previous = history[history["commit"] == commits[-2]][keys + ["value"]].rename(columns={"value": "previous"})
        latest = latest.merge(previous, on=keys, how="left")
    else:
        latest = latest.assign(previous=math.nan)
    latest["ratio"] = latest["value"] / latest["previous"]
    return latest.reset_index(drop=True)


def history_table(history: pd.DataFrame, commits: int = TABLE_COMMITS) -> pd.DataFrame:
    """A history table -> one row per benchmark and parameter combination (in the newest commit's order, then any
    that only older commits ran), columns benchmark, params, unit and one per commit (its short hash; the newest
    `commits` of them, oldest first) holding the value, NaN where it failed or did not run."""
    shown = commits_in_order(history)[-commits:]
    keys = ["benchmark", "params"]
    if not shown:
        return pd.DataFrame(columns=[*keys, "unit"])
    part = history[history["commit"].isin(shown)]
    wide = part.pivot_table(index=keys, columns="commit", values="value", aggfunc="last", dropna=False, sort=False)
    wide = wide.reindex(columns=shown)
    units = part.groupby(keys, sort=False)["unit"].last()
    order = list(dict.fromkeys([*map(tuple, part.loc[part["commit"] == shown[-1], keys].values),
                                *map(tuple, part[keys].values)]))
    wide = wide.reindex(pd.MultiIndex.from_tuples(order, names=keys))
    wide.insert(0, "unit", units.reindex(wide.index).values)
    return wide.reset_index().rename_axis(columns=None)


def commit_labels(history: pd.DataFrame, commits: Sequence[str]) -> dict[str, str]:
    """Short hash -> 'hash (YYYY-MM-DD)', the commit's date as asv stored it."""
    dates = history.groupby("commit")["commit_date"].first()
    return {c: f"{c} ({dates[c]:%Y-%m-%d})" if c in dates and pd.notna(dates[c]) else c for c in commits}


def change_class(value: float, previous: float, factor: float = DEFAULT_FACTOR) -> str:
    """'worse' above factor x the commit before, 'better' below 1 / factor, '' otherwise or where either is
    missing (every value is smaller-is-better)."""
    if not (math.isfinite(value) and math.isfinite(previous)) or previous <= 0 or value < 0:
        return ""
    ratio = value / previous
    return "worse" if ratio > factor else "better" if ratio < 1 / factor else ""


def _history_text(table: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """The history table as text: each value in its unit, '-' where missing."""
    commits = [c for c in table.columns if c in labels]
    text = table[["benchmark", "params"]].copy()
    for commit in commits:
        text[labels[commit]] = [human(v, u) for v, u in zip(table[commit], table["unit"], strict=True)]
    return text


def _history_html(table: pd.DataFrame, labels: dict[str, str], factor: float = DEFAULT_FACTOR) -> str:
    """The history table as an HTML table, each value classed 'worse' or 'better' against the commit before."""
    commits = [c for c in table.columns if c in labels]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["benchmark", "params", *(labels[c] for c in commits)])
    rows = []
    for _, row in table.iterrows():
        cells = [f"<td>{html.escape(str(row['benchmark']))}</td>", f"<td>{html.escape(str(row['params']))}</td>"]
        previous = math.nan
        for commit in commits:
            value = row[commit]
            kind = change_class(value, previous, factor)
            cells.append(f"<td class='num {kind}'>{html.escape(human(value, row['unit']))}</td>".replace(" '>", "'>"))
            if math.isfinite(value):
                previous = value
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table class='history'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# ------------------------------------------------------------------------------------------------------ plots

def _figure(panels: int):
    """A figure with one axes per panel, two columns, no pyplot state (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    columns = 1 if panels == 1 else 2
    rows = math.ceil(panels / columns)
    fig = Figure(figsize=(8 * columns, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes


def _axis_label(unit: str) -> str:
    return {"seconds": "seconds (smaller is better)", "bytes": "bytes (smaller is better)"}.get(
        unit, f"{unit} (smaller is better)" if unit else "smaller is better")


def _scale(ax: Any, values: pd.Series) -> None:
    """Log scale when the positive values span more than 50x; otherwise linear from 0, so that changes read true."""
    positive = values[values > 0]
    if len(positive) and positive.max() / positive.min() > 50:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def _tidy_legend(ax: Any, hide_single: bool = False) -> None:
    """The legend beside the axes (clear of the data), untitled, small; none for a single series when hide_single."""
    import seaborn as sns

    legend = ax.get_legend()
    if legend is None:
        return
    if hide_single and len(legend.get_texts()) <= 1:
        legend.remove()
        return
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1.0), title=None, fontsize=7, frameon=False)


def _split_params(params: pd.Series) -> tuple[list[str], list[str]]:
    """'a=x, b=y' labels -> (first parameter's values, the rest as a label), for an x axis and a hue."""
    first, rest = [], []
    for label in params:
        parts = label.split(", ") if label else []
        first.append(parts[0].split("=", 1)[-1] if parts else "")
        rest.append(", ".join(parts[1:]))
    return first, rest


def plot_latest(rows: pd.DataFrame) -> Any:
    """One module's latest rows -> bars per benchmark function: x = first parameter, hue = the others."""
    import seaborn as sns

    functions = list(dict.fromkeys(rows["function"]))
    fig, axes = _figure(len(functions))
    for ax, function in zip(axes, functions, strict=False):
        part = rows[rows["function"] == function].copy()
        part["x"], part["hue"] = _split_params(part["params"])
        if (part["x"] == "").all():
            part["x"] = function.rsplit(".", 1)[-1]
        hue = "hue" if (part["hue"] != "").any() else None
        sns.barplot(data=part, x="x", y="value", hue=hue, ax=ax, errorbar=None)
        _scale(ax, part["value"])
        ax.set_title(function, fontsize=10)
        ax.set_xlabel("")
        ax.set_ylabel(_axis_label(part["unit"].iloc[0]))
        ax.tick_params(axis="x", labelrotation=20)
        _tidy_legend(ax)
    return fig


def plot_history(rows: pd.DataFrame, commits: Sequence[str]) -> Any:
    """One module's history -> a line per benchmark and parameter combination over the commits (oldest left)."""
    import seaborn as sns

    functions = list(dict.fromkeys(rows["function"]))
    fig, axes = _figure(len(functions))
    position = {commit: index for index, commit in enumerate(commits)}
    for ax, function in zip(axes, functions, strict=False):
        part = rows[rows["function"] == function].copy()
        part["commit_index"] = part["commit"].map(position)
        part["series"] = part["params"].where(part["params"] != "", function.rsplit(".", 1)[-1])
        sns.lineplot(data=part, x="commit_index", y="value", hue="series", marker="o", ax=ax, errorbar=None)
        _scale(ax, part["value"])
        shown = sorted(set(part["commit_index"].dropna().astype(int)))
        ax.set_xticks(shown, [commits[i] for i in shown], rotation=30, fontsize=8)
        ax.set_xlim(-0.5, len(commits) - 0.5)
        ax.set_title(function, fontsize=10)
        ax.set_xlabel("commit (oldest to newest)")
        ax.set_ylabel(_axis_label(part["unit"].iloc[0]))
        _tidy_legend(ax, hide_single=True)
    return fig


def png_bytes(fig: Any) -> bytes:
    """A figure as PNG (the report's renderer)."""
    from harness.report.figures import png_bytes as render

    return render(fig)


# ------------------------------------------------------------------------------------------------------ pages

def _display(latest: pd.DataFrame) -> pd.DataFrame:
    """The latest table as text columns: value and previous with units, the ratio to 3 decimals."""
    return pd.DataFrame({
        "benchmark": latest["benchmark"],
        "params": latest["params"],
        "latest": [human(v, u) for v, u in zip(latest["value"], latest["unit"], strict=True)],
        "previous commit": [human(v, u) for v, u in zip(latest["previous"], latest["unit"], strict=True)],
        "latest / previous": [f"{r:.3f}" if math.isfinite(r) else "-" for r in latest["ratio"]],
    })


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame of text as a GitHub markdown table (pipes escaped)."""
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(c) for c in frame.columns) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _header(history: pd.DataFrame, commits: list[str]) -> list[str]:
    latest = history[history["commit"] == commits[-1]]
    run_at = latest["run_at"].max().strftime("%Y-%m-%d %H:%M UTC")
    failed = latest[latest["value"].isna()]
    lines = [f"Latest: commit {commits[-1]}, run {run_at}; {len(latest)} results, {len(failed)} failed.",
             f"History: {len(commits)} commit(s), oldest to newest: {', '.join(commits)}.",
             "Every value is smaller-is-better (seconds, bytes, or a ratio to a peer); "
             "docs/benchmarks.md says what each benchmark measures."]
    if len(failed):
        lines.append("Failed: " + ", ".join(sorted(set(failed["benchmark"]))) + ".")
    return lines


def _history_intro(shown: int, stored: int, factor: float = DEFAULT_FACTOR) -> str:
    kept = f"the newest {shown} of {stored} stored commits" if shown < stored else f"the {stored} stored commit(s)"
    return (f"Each benchmark across {kept}, oldest left. The regression check (benchmarks/asv_tools/regress.py) "
            f"flags a value above {factor:g}x its baseline's; in the HTML page a value above {factor:g}x the commit "
            f"before it is red, below 1/{factor:g} green.")


def render_markdown(history: pd.DataFrame, images: Sequence[str], commits: int = TABLE_COMMITS) -> str:
    stored = commits_in_order(history)
    parts = ["# dtbench benchmarks: summary", ""]
    if not stored:
        return "\n".join(parts + ["No asv results yet: run `nox -s bench`.", ""])
    parts += [line + "  " for line in _header(history, stored)]
    parts += ["", "## Latest results", "", markdown_table(_display(latest_table(history)))]
    table = history_table(history, commits)
    labels = commit_labels(history, [c for c in table.columns if c in stored])
    parts += ["", "## History, commit by commit", "", _history_intro(len(labels), len(stored)), "",
              markdown_table(_history_text(table, labels))]
    parts += ["", "## Plots", ""]
    parts += [f"![{name}]({name})" for name in images]
    return "\n".join(parts + [""])


def render_html(history: pd.DataFrame, images: dict[str, bytes], generated: str,
                commits: int = TABLE_COMMITS) -> str:
    stored = commits_in_order(history)
    style = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1400px}"
             "table{border-collapse:collapse;font-size:.85em}th,td{border:1px solid #ccc;padding:.2em .6em}"
             "th{background:#f0f0f0}img{max-width:100%;border:1px solid #eee;margin:.5em 0}.meta{color:#666}"
             "td.num{text-align:right;white-space:nowrap}td.worse{background:#f8d0d0}td.better{background:#d4f0d4}")
    body = [f"<h1>dtbench benchmarks: summary</h1><p class='meta'>generated {html.escape(generated)}</p>"]
    if not stored:
        body.append("<p>No asv results yet: run <code>nox -s bench</code>.</p>")
    else:
        body += [f"<p>{html.escape(line)}</p>" for line in _header(history, stored)]
        body.append("<h2>Latest results</h2>")
        body.append(_display(latest_table(history)).to_html(index=False, escape=True, border=0))
        table = history_table(history, commits)
        labels = commit_labels(history, [c for c in table.columns if c in stored])
        body.append("<h2>History, commit by commit</h2>")
        body.append(f"<p>{html.escape(_history_intro(len(labels), len(stored)))}</p>")
        body.append(_history_html(table, labels))
        body.append("<h2>Plots</h2>")
        for name, data in images.items():
            encoded = base64.b64encode(data).decode("ascii")
            body.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{encoded}'>"
                        f"<figcaption>{html.escape(name)}</figcaption></figure>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>dtbench benchmarks</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_summary(results_dir: str | Path, out_dir: str | Path, machine: str | None = None,
                  commits: int = TABLE_COMMITS) -> Path:
    """Write the summary files (module docstring) into out_dir; return the path of index.md."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    history = load_history(results_dir, machine)
    stored = commits_in_order(history)
    history.to_csv(out_dir / "history.csv", index=False)
    latest_table(history).to_csv(out_dir / "latest.csv", index=False)
    images: dict[str, bytes] = {}
    if stored:
        latest = history[history["commit"] == stored[-1]]
        for module in dict.fromkeys(latest["module"]):
            images[f"latest_{module}.png"] = png_bytes(plot_latest(latest[latest["module"] == module]))
        for module in dict.fromkeys(history["module"]):
            images[f"history_{module}.png"] = png_bytes(plot_history(history[history["module"] == module], stored))
    for stale in out_dir.glob("*.png"):
        if stale.name not in images:
            stale.unlink()
    for name, data in images.items():
        (out_dir / name).write_bytes(data)
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    (out_dir / "index.html").write_text(render_html(history, images, generated, commits))
    index = out_dir / "index.md"
    index.write_text(render_markdown(history, list(images), commits))
    return index


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", default=".asv/results", help="asv's results folder (default .asv/results)")
    parser.add_argument("--out", default=".asv/summary", help="where to write (default .asv/summary)")
    parser.add_argument("--machine", help="asv machine name (default: that of the newest results)")
    parser.add_argument("--commits", type=int, default=TABLE_COMMITS,
                        help=f"commits in the history table, the newest (default {TABLE_COMMITS})")
    args = parser.parse_args(argv)
    if args.commits < 1:
        parser.error("--commits must be at least 1")
    try:
        index = write_summary(args.results_dir, args.out, args.machine, args.commits)
    except ResultsError as err:
        print(f"summary: {err}", file=sys.stderr)
        return 2
    print(f"summary: {index} and {index.with_suffix('.html')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
