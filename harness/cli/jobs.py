"""`dtbench status` and `dtbench wait`: the state of each run of a suite, local or on SLURM."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.cli.common import fail


def add(verbs) -> None:
    status = verbs.add_parser(
        "status", help="show the state of each run of a suite's results",
        description="One line per run of SUITE_DIR: its state (pending, running, requeued, preempted, completed, "
                    "failed, diverged) from status.json and, for SLURM runs, the scheduler (squeue/sacct or the "
                    "site's names for them), with the job id and the step or error. Given a folder of suites "
                    "(e.g. results), one line per suite with its count of runs in each state.")
    status.add_argument("suite_dir", type=Path,
                        help="a suite's results folder, e.g. results/smoke, or a folder of them, e.g. results")
    status.set_defaults(handler=status_verb)

    wait = verbs.add_parser(
        "wait", help="block until every run of a suite has ended",
        description="Poll SUITE_DIR (as `dtbench status` does) until no run is pending, running or requeued and "
                    "no run's job is left in the queue. Exit 0 when every run completed, 1 otherwise, 3 on "
                    "--timeout.")
    wait.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/smoke")
    wait.add_argument("--poll", type=float, default=10.0, metavar="S", help="seconds between polls (default 10)")
    wait.add_argument("--timeout", type=float, default=None, metavar="S", help="give up after S seconds")
    wait.set_defaults(handler=wait_verb)


def status_verb(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.launch.jobs import format_table, suite_states

    if not args.suite_dir.is_dir():
        return fail(f"{args.suite_dir}: no such results folder")
    rows = suite_states(args.suite_dir)
    if rows:
        print(format_table(rows))
        return 0
    suites = [d for d in sorted(args.suite_dir.iterdir()) if d.is_dir() and any(d.glob("*/spec.json"))]
    if not suites:
        print(f"no runs in {args.suite_dir} (a suite's folder holds <run id>/spec.json, e.g. results/smoke)")
        return 0
    from harness.launch.jobs import format_suites

    print(format_suites({d.name: suite_states(d) for d in suites}))
    print(f"{len(suites)} suites in {args.suite_dir}; `dtbench status {args.suite_dir / suites[0].name}` lists a "
          "suite's runs")
    return 0


def wait_verb(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.launch.jobs import format_table, suite_states

    if not args.suite_dir.is_dir():
        return fail(f"{args.suite_dir}: no such results folder")
    start = time.monotonic()
    while True:
        rows = suite_states(args.suite_dir)
        if all(row.settled for row in rows):
            break
        if args.timeout is not None and time.monotonic() - start > args.timeout:
            print(format_table(rows))
            print(f"dtbench wait: runs still going after {args.timeout:g} s", file=sys.stderr)
            return 3
        time.sleep(args.poll)
    print(format_table(rows))
    bad = [row for row in rows if row.state != "completed"]
    print(f"{len(rows) - len(bad)}/{len(rows)} runs completed.")
    return 1 if bad else 0
