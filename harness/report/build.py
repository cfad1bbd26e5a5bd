"""Writing a suite's report folder: summary.csv, the PNG plots and index.html, from the run folders alone."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from html import escape as html_escape
from pathlib import Path

import pandas as pd

from harness.report import (
    baselines,
    comparisons,
    figures,
    hygiene,
    network,
    page,
    pipeline,
    rankings,
    resources,
    stats,
    tables,
)
from harness.report import plots as plots_module
from harness.report.csvfile import write_csv
from harness.results import RunResult, load_suite

#: The method whose label is the default baseline, when the suite has runs of it.
DEFAULT_BASELINE_METHOD = "ddp"


def choose_baseline(table: pd.DataFrame, requested: str | None = None) -> tuple[str, str]:
    """summary (runs x columns) -> (baseline label, how it was chosen).

    The baseline is a label without its ' @ <network>' suffix (so it names the same method at every network).
    `requested` must be such a label, or a full label; None picks the first ddp label when the suite has one, else
    the first run's label. Raises ValueError (one line listing the labels) for a label no run has.
    """
    names = [network.method_label(str(label), str(net)) for label, net in
             zip(table["label"], table["network"].fillna(""), strict=True)]
    known = list(dict.fromkeys(names))
    if requested is not None:
        if requested in known:
            return requested, "--baseline"
        full = dict(zip(table["label"].astype(str), names, strict=True))
        if requested in full:
            return full[requested], "--baseline"
        raise ValueError(f"--baseline {requested!r}: no run has that label (labels: {', '.join(known)})")
    for name, method in zip(names, table["method"], strict=True):
        if method == DEFAULT_BASELINE_METHOD:
            return name, f"default: the first {DEFAULT_BASELINE_METHOD} label"
    return known[0], f"default: no {DEFAULT_BASELINE_METHOD} run, so the first run's label"


#: A maker of an extra page section: (suite_dir, runs, summary table, out_dir) -> the section's HTML, or None for
#: no section. It may write files of its own into out_dir. The claims package provides one (harness/claims/section.py),
#: so the report does not depend on the packages that build on it.
SectionMaker = Callable[[Path, list[RunResult], pd.DataFrame, Path], "str | None"]
#: A warning at the top of the page: (suite_dir, runs) -> HTML ('' for none).
WarningMaker = Callable[[Path, list[RunResult]], str]


def dropped_lines_text(runs: list[RunResult]) -> str:
    """One line on the corrupt metrics.jsonl lines the runs' readers skipped ('' when none): how many, in which runs."""
    dropped = [(run.run_dir.name, run.dropped_lines) for run in runs if run.dropped_lines]
    if not dropped:
        return ""
    shown = ", ".join(f"{name}: {count}" for name, count in dropped[:5]) + (", ..." if len(dropped) > 5 else "")
    total = sum(count for _, count in dropped)
    return (f"skipped {total} corrupt line{'s' if total > 1 else ''} of metrics.jsonl in {len(dropped)} "
            f"run{'s' if len(dropped) > 1 else ''} ({shown}); the rest of each file was read")


@stats.extreme_values_shown
def write_report(suite_dir: str | Path, out_dir: str | Path | None = None, baseline: str | None = None,
                 extra_sections: Sequence[SectionMaker] = (),
                 extra_warnings: Sequence[WarningMaker] = ()) -> Path:
    """Write summary.csv, rankings.csv, comparisons.csv, the PNG plots and index.html for a suite folder; return
    the path of index.html.

    Corrupt lines of the runs' metrics.jsonl are skipped (each with a warning): the page and one more warning say
    how many, in which runs (dropped_lines_text).

    The page opens with the rankings per workload and network (report/rankings.py: speed-ups over each workload's
    baseline, baselines.workload_baselines: `baseline` where it ran, else the suite's for that workload, else its
    first ddp run; none where one label ran; the page names them), then the per-label table
    (a row per workload and label, in rank order; under it, the labels identical on every seed). Plots
    (report/plots.py: one panel per workload, a caption naming the runs each leaves out): accuracy against train
    time and epochs, training loss, time to target as survival
    (Kaplan–Meier curves per label, report/survival.py), bytes per sample, throughput, each rank's peak memory,
    (when a method runs at several world sizes) scaling, (with 3 seeds or more a label) probability of improvement,
    (when the runs span several workloads) AlgoPerf performance profiles, (with auxiliary heads) per-chunk head
    accuracy, a Gantt chart of a traced step per pipeline label, and
    (when the runs span more than one network) throughput, time to target and speed-up against the link rate, with
    a 'By network' section. A 'Robust comparisons' section gives, per workload, IQM, probability of improvement over
    its baseline, the MLPerf result and the labels identical on every seed, then AlgoPerf scores over the labels
    that ran every problem; each of `extra_sections` may add a section after it
    (`dtbench report` passes the Claims section: harness/claims/section.py), and each of `extra_warnings`
    (suite_dir, runs) -> HTML a warning at the top (`dtbench report` passes the runs that suite.toml no longer asks
    for: harness/report/stale.py). Warnings at the top name runs starved
    of CPU and say when labels have fewer than 3 seeds.

    out_dir defaults to suite_dir/report. Aggregates, curves and bar plots use the completed runs (every run
    when none completed); the summary table lists every run. Raises ValueError when the folder holds no run or the
    baseline names no label.
    """
    suite_dir = Path(suite_dir)
    runs = load_suite(suite_dir)
    if not runs:
        raise ValueError(f"{suite_dir}: no runs found (no */spec.json)")
    dropped = dropped_lines_text(runs)
    if dropped:
        warnings.warn(f"{suite_dir}: {dropped}", stacklevel=2)
    table = tables.summary(runs)
    baseline_label, chosen = choose_baseline(table, baseline)  # validates --baseline; the network section's
    per_workload = baselines.workload_baselines(table, runs, baseline)
    base_of = {workload: b.label for workload, b in per_workload.items()}
    if set(base_of.values()) == {baseline_label}:
        named = (baseline_label, chosen)
    else:
        named = ("each workload's own", baselines.baselines_text(per_workload))
    out_dir = Path(out_dir) if out_dir is not None else suite_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)

    targets = {str(workload): tables.common_target_of([run for run in runs
                                                        if str(run.spec.get("workload")) == workload])
               for workload in {str(w) for w in table["workload"]}}
    readings = tables.readings(runs)
    ranked = rankings.rankings(table, base_of, targets, readings)
    write_csv(ranked, out_dir / "rankings.csv")
    table = pd.concat([table, rankings.run_speedups(table, ranked, base_of)], axis=1)
    write_csv(table, out_dir / "summary.csv")
    completed = [run for run in runs if run.state == "completed"]
    used = completed or runs
    scope = (f"Aggregates and plots use the {len(completed)} completed runs." if completed
             else "No run completed: aggregates and plots use every run.")
    used_table = table[table["state"] == "completed"] if completed else table
    has_target = any(tables.target_of(run.spec) is not None for run in used)
    robust = comparisons.robust_table(rankings.in_rank_order(used_table, ranked), base_of, has_target, readings)
    write_csv(robust, out_dir / "comparisons.csv")
    aggregates = rankings.in_rank_order(tables.aggregate(table, ("completed",) if completed else None), ranked)
    few_seeds = (page.fewest_runs(aggregates) or 0) < page.MIN_SEEDS
    interval = stats.interval_words(page.fewest_runs(aggregates))
    scores, profile, left_out = None, None, None
    if has_target:
        covered, left_out, _ = comparisons.covering(table)
        if comparisons.with_keys(covered)["method_label"].nunique() > 1:
            scores, profile = comparisons.algoperf(covered)
    plots = plots_module.suite_plots(runs, used, rankings.in_rank_order(table, ranked),
                                     rankings.in_rank_order(used_table, ranked), robust, named[0], profile,
                                     few_seeds, interval)
    identical = comparisons.identical_labels(used_table)
    sections = [comparisons.comparisons_html(robust, scores, base_of, few_seeds, left_out, identical)]
    for make in extra_sections:
        extra = make(suite_dir, runs, table, out_dir)
        if extra:
            sections.append(extra)
    memory_section = resources.memory_html(table)
    if memory_section:
        sections.append(memory_section)
    pipeline_section = pipeline.pipeline_html(used, used_table, out_dir)
    if pipeline_section:
        sections.append(pipeline_section)
    if used_table["network"].nunique() > 1:
        speedups = network.network_speedup(used_table, baseline_label)
        write_csv(speedups, out_dir / "network_speedup.csv")
        plots.append(plots_module.Plot("network_crossover.png",
                                       network.plot_network_crossover(speedups, baseline_label)))
        sections.append(network.network_html(speedups, baseline_label))
    images = {}
    for plot in plots:
        images[plot.name] = figures.png_bytes(plot.figure)
        (out_dir / plot.name).write_bytes(images[plot.name])
    shown = plots_module.figures_html(images, {plot.name: plot.caption for plot in plots})

    suite = str(runs[0].spec.get("suite") or suite_dir.name)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    html = page.render_html(suite, generated, table, aggregates, tables.failures(runs), shown, scope, sections,
                            named,
                            [*(warn(suite_dir, runs) for warn in extra_warnings), hygiene.noisy_html(table),
                             page.small_sample_html(aggregates),
                             f'<p class="warning"><b>Corrupt records.</b> {html_escape(dropped)}.</p>\n' if dropped
                             else ""],
                            rankings=rankings.rankings_html(ranked, base_of, interval), interval=interval,
                            readings=readings, setups=page.label_setups([run.spec for run in runs]),
                            notes="".join(comparisons.identical_html(groups, workload)
                                          for workload, groups in identical.items()))
    index = out_dir / "index.html"
    index.write_text(html, encoding="utf-8")
    return index
