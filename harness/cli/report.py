"""`dtbench report` and `dtbench list`: a suite's comparative report, and what methods and workloads exist."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import fail


def add(verbs) -> None:
    report = verbs.add_parser(
        "report", help="write the comparative report of a suite's results",
        description="Read OUT/<suite>/*/metrics.jsonl and write OUT/<suite>/report/: index.html (self-contained), "
                    "summary.csv (one row per run) and PNG plots (accuracy against train time and epochs with 95% "
                    "CI bands over seeds, time to target, bytes per sample). The page names the baseline that "
                    "speed-ups are measured against.")
    report.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/smoke")
    report.add_argument("--out", type=Path, default=None, help="report folder (default: SUITE_DIR/report)")
    report.add_argument("--baseline", metavar="LABEL",
                        help="the run label comparisons are made against, without its ' @ <network>' part (e.g. "
                             "'ddp x2'); default: the first ddp label when the suite has one, else the first run's")
    report.set_defaults(handler=report_verb)

    listing = verbs.add_parser(
        "list", help="list the registered methods and workloads",
        description="Print the registered methods (name, family, summary) and workloads (name, dataset, model, "
                    "target accuracy), each with where it comes from: builtin, or the entry point of an installed "
                    "package (groups dtbench.methods and dtbench.workloads). A suite may also name a class by "
                    "import path, package.module:Class (docs/methods-api.md).")
    listing.set_defaults(handler=list_verb)


def report_verb(args: argparse.Namespace, argv: list[str]) -> int:
    if not args.suite_dir.is_dir():
        return fail(f"{args.suite_dir}: no such results folder")
    from harness.claims.section import claims_page_section
    from harness.report.build import write_report

    try:
        index = write_report(args.suite_dir, args.out, args.baseline, extra_sections=[claims_page_section],
                             extra_warnings=[stale_warning])
    except ValueError as exc:
        return fail(str(exc))
    except OSError as exc:  # e.g. a file where the report folder goes
        return fail(f"{exc.filename or args.suite_dir}: cannot write the report: {exc.strerror or exc}")
    print(f"report written: {index}")
    return 0


def stale_warning(suite_dir: Path, runs: list) -> str:
    """The page's warning naming the runs whose spec.json the suite.toml beside them no longer asks for."""
    from harness.report.stale import stale_html
    from harness.suite.compare import against_suite

    return stale_html(*against_suite(suite_dir / "suite.toml", [(run.run_dir.name, run.spec) for run in runs]))


def _origin(entry) -> str:
    return "builtin" if entry.kind == "builtin" else f"entry point of {entry.distribution} ({entry.reference})"


def list_verb(args: argparse.Namespace, argv: list[str]) -> int:
    from harness import registry

    rows = []
    for name, entry in registry.METHODS.entries().items():
        try:
            cls = registry.METHODS.get(name)
            rows.append((name, cls.family, cls.summary, _origin(entry)))
        except registry.RegistryError as exc:  # a broken plug-in is shown, not fatal
            rows.append((name, "?", f"cannot load: {exc}", _origin(entry)))
    _table("methods:", sorted(rows))
    rows = []
    for name, entry in registry.WORKLOADS.entries().items():
        try:
            w = registry.WORKLOADS.get(name)
            target = w.target_text
            rows.append((name, f"{w.dataset}; {w.model}; {target}", "", _origin(entry)))
        except registry.RegistryError as exc:
            rows.append((name, f"cannot load: {exc}", "", _origin(entry)))
    _table("workloads:", sorted(rows))
    return 0


def _table(title: str, rows: list[tuple[str, str, str, str]]) -> None:
    print(title)
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(2)]
    for name, second, third, origin in rows:
        middle = f"{second:<{widths[1]}}  {third}" if third else second
        print(f"  {name:<{widths[0]}}  {middle}  [{origin}]")
