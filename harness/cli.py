"""The `dtbench` command line: run, status, wait, report, list, rerun and net-check."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

EPILOG = "Exit codes: 0 every run completed; 1 some run failed or diverged; 2 bad input (nothing written)."
NETWORK_HELP = ("emulate a network: every rank in its own network namespace, its link limited to RATE each way by tc "
                "tbf, and an optional one-way LATENCY between ranks added by a userspace relay. Form: "
                "RATE[,latency=TIME], e.g. 1gbit, 100mbit, 'unlimited', '100mbit,latency=1ms' (rates in bit, kbit, "
                "mbit, gbit; times in us, ms, s). Needs root and iproute2. See docs/network.md")


def _network(text: str):
    """argparse type of --network: the parsed NetworkSpec, or argparse's one-line error."""
    from harness.network import parse_network

    try:
        return parse_network(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtbench",
        description="Benchmark parallel DNN training methods on one shared runner: same workload, data order, "
                    "budget and evaluation; real processes and real torch.distributed communication.",
        epilog=EPILOG)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    run = verbs.add_parser(
        "run", help="run every run of a suite file",
        description="Run every run of SUITE (a TOML suite file, see docs/suites.md), once per seed. Results go to "
                    "OUT/<suite name>/<run id>/ (spec.json, manifest.json, metrics.jsonl, status.json, logs/). "
                    "A failed or diverged run is reported and the suite goes on.",
        epilog=EPILOG)
    run.add_argument("suite", type=Path, help="the suite file, e.g. suites/smoke.toml")
    run.add_argument("--out", type=Path, default=Path("results"), help="results folder (default: results)")
    run.add_argument("--launcher", choices=["local", "slurm"], default="local",
                     help="where ranks run: local = one process per rank on this machine (default); slurm = submit "
                          "every run as a task of a SLURM job array through submitit and return at once "
                          "(see docs/slurm.md)")
    run.add_argument("--site", type=Path, metavar="SITE.toml",
                     help="slurm: the site profile (partition, account, limits, setup lines, command names such "
                          "as Tianhe's yhbatch/yhrun), e.g. sites/tianhe.toml")
    run.add_argument("--nodes", type=int, metavar="N",
                     help="slurm: nodes per run for every run (world_size / N tasks on each); overrides the suite")
    run.add_argument("--only", metavar="GLOB", help="run only the runs whose run id matches this shell pattern")
    run.add_argument("--resume", action="store_true",
                     help="skip runs whose status.json says completed; continue the others from their "
                          "checkpoint.pt where they have one, else rerun them from the start")
    run.add_argument("--dry-run", action="store_true", help="validate and list the runs; write nothing")
    run.add_argument("--quiet", action="store_true", help="no progress bars (the per-run lines still print)")
    run.add_argument("--network", metavar="SPEC", type=_network,
                     help=NETWORK_HELP + ". Replaces the suite's [network] and every run's network (run ids and "
                                         "labels then carry it).")

    status = verbs.add_parser(
        "status", help="show the state of each run of a suite's results",
        description="One line per run of SUITE_DIR: its state (pending, running, requeued, preempted, completed, "
                    "failed, diverged) from status.json and, for SLURM runs, the scheduler (squeue/sacct or the "
                    "site's names for them), with the job id and the step or error.")
    status.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/smoke")

    wait = verbs.add_parser(
        "wait", help="block until every run of a suite has ended",
        description="Poll SUITE_DIR (as `dtbench status` does) until no run is pending, running or requeued and "
                    "no run's job is left in the queue. Exit 0 when every run completed, 1 otherwise, 3 on "
                    "--timeout.")
    wait.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/smoke")
    wait.add_argument("--poll", type=float, default=10.0, metavar="S", help="seconds between polls (default 10)")
    wait.add_argument("--timeout", type=float, default=None, metavar="S", help="give up after S seconds")

    report = verbs.add_parser(
        "report", help="write the comparative report of a suite's results",
        description="Read OUT/<suite>/*/metrics.jsonl and write OUT/<suite>/report/: index.html (self-contained), "
                    "summary.csv (one row per run) and PNG plots (accuracy against train time and epochs with 95%% "
                    "CI bands over seeds, time to target, bytes per sample).")
    report.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/smoke")
    report.add_argument("--out", type=Path, default=None, help="report folder (default: SUITE_DIR/report)")

    verbs.add_parser("list", help="list the registered methods and workloads",
                     description="Print the registered methods (name, family, summary) and workloads (name, "
                                 "dataset, model, target accuracy).")

    rerun = verbs.add_parser(
        "rerun", help="run one run again from its run folder alone",
        description="Read RUN_DIR/spec.json (written by every run) and run exactly that spec again into "
                    "OUT/<suite>/<run id>/. No suite file is needed.", epilog=EPILOG)
    rerun.add_argument("run_dir", type=Path, help="a run folder holding spec.json")
    rerun.add_argument("--out", type=Path, default=Path("results/rerun"),
                       help="results folder for the rerun (default: results/rerun)")
    rerun.add_argument("--quiet", action="store_true", help="no progress bar")

    check = verbs.add_parser(
        "net-check", help="measure an emulated network against the ring all-reduce model",
        description="Build the emulated network of --network for --world-size ranks (as `dtbench run` does), then "
                    "measure (1) a point-to-point send of --size-mb MiB from rank 0 to rank 1 plus a one-element "
                    "acknowledgement, against size/B + 2·latency, and (2) a gloo all_reduce of --size-mb MiB over all "
                    "ranks, against the ring model 2(W-1)/W·size/B + 2(W-1)·latency, where B is the rate of each "
                    "rank's link in each direction. Each is the median of --repeats timings after a warm-up. Prints "
                    "a table (measured, model, ratio, achieved Mbit/s) and removes the network. With an unlimited "
                    "rate there is no model: the table shows what the namespaces achieve.",
        epilog="Exit codes: 0 every probe within the tolerance (or no model); 1 some probe off by more; 2 the network "
               "cannot be built here (needs root and iproute2) or bad input.")
    check.add_argument("--network", metavar="SPEC", type=_network, required=True, help=NETWORK_HELP)
    check.add_argument("--world-size", type=int, default=2, metavar="N", help="number of ranks (default 2)")
    check.add_argument("--size-mb", type=float, default=10.0, metavar="MIB",
                       help="payload of both probes in MiB (default 10)")
    check.add_argument("--repeats", type=int, default=3, help="timed repetitions per probe (default 3)")
    check.add_argument("--tolerance", type=float, default=0.25,
                       help="largest accepted |measured/model - 1| (default 0.25)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"run": _cmd_run, "report": _cmd_report, "list": _cmd_list, "rerun": _cmd_rerun,
               "status": _cmd_status, "wait": _cmd_wait, "net-check": _cmd_net_check}[args.verb]
    # SIGTERM (kill, timeout) tears down like Ctrl-C: ranks stopped, namespaces removed, the run marked failed.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        return handler(args, argv if argv is not None else sys.argv[1:])
    except KeyboardInterrupt:
        print("dtbench: interrupted; the running run was torn down and marked failed", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _network_problem(specs) -> str | None:
    """Why the emulated networks of these runs cannot be built here, or None (also when no run has one)."""
    from harness.network import requirements_problem

    for spec in specs:
        if spec.network is not None:
            problem = requirements_problem(spec.network)
            if problem:
                return problem
    return None


def _fail(message: str) -> int:
    print(f"dtbench: error: {message}", file=sys.stderr)
    return 2


def _finish(outcomes) -> int:
    bad = [o for o in outcomes if o.state != "completed"]
    done = len(outcomes) - len(bad)
    print(f"{done}/{len(outcomes)} runs completed.")
    for o in bad:
        message = (o.error or {}).get("message") or "no error message"
        print(f"  {o.state}: {o.spec.run_id}: {message}")
    return 1 if bad else 0


def _cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.config import SuiteError, expand_suite

    try:
        specs = expand_suite(args.suite, args.only, args.network)
    except SuiteError as exc:
        return _fail(str(exc))
    if not specs:
        return _fail(f"{args.suite}: no run id matches --only {args.only!r}")
    if args.launcher == "slurm":
        return _submit(args, specs, argv)
    if args.site or args.nodes:
        return _fail("--site and --nodes are for --launcher slurm")
    if args.dry_run:
        for spec in specs:
            print(f"{spec.run_id}\t{spec.method}\t{spec.workload}\tworld_size={spec.world_size}\tseed={spec.seed}")
        print(f"{len(specs)} runs; nothing written (--dry-run).")
        return 0
    problem = _network_problem(specs)
    if problem:
        return _fail(problem)
    from harness.suite import run_specs

    print(f"suite {specs[0].suite}: {len(specs)} runs -> {args.out / specs[0].suite}")
    outcomes = run_specs(specs, args.out, resume=args.resume, argv=["dtbench", *argv], suite_file=args.suite,
                         show_progress=not args.quiet)
    return _finish(outcomes)


def _submit(args: argparse.Namespace, specs, argv: list[str]) -> int:
    from harness.config import SuiteError
    from harness.sites import load_site

    try:
        site = load_site(args.site)
    except SuiteError as exc:
        return _fail(str(exc))
    emulated = [s.run_id for s in specs if s.network is not None]
    if emulated:
        return _fail(f"{emulated[0]}: network emulation runs with the local launcher only (a cluster has its own "
                     "network); drop --network and [network] for --launcher slurm")
    if args.nodes is not None:
        bad = [s.run_id for s in specs if args.nodes < 1 or s.world_size % args.nodes]
        if bad:
            return _fail(f"--nodes {args.nodes}: does not divide the world size of {bad[0]}")
        specs = [s.model_copy(update={"nodes": args.nodes}) for s in specs]
    if args.dry_run:
        for spec in specs:
            print(f"{spec.run_id}\tnodes={spec.nodes}\ttasks_per_node={spec.world_size // spec.nodes}")
        print(f"{len(specs)} runs; nothing submitted (--dry-run).")
        return 0
    from harness.suite import submit_specs

    try:
        submitted = submit_specs(specs, args.out, site, resume=args.resume, argv=["dtbench", *argv],
                                 suite_file=args.suite)
    except RuntimeError as exc:
        return _fail(str(exc))
    suite_dir = args.out / specs[0].suite
    for item in submitted:
        print(f"{item.spec.run_id}\tjob {item.job_id}")
    print(f"{len(submitted)} runs submitted to SLURM (site {site.name}). Follow them with: dtbench status {suite_dir}"
          f"; block until done with: dtbench wait {suite_dir}")
    return 0


def _cmd_status(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.jobs import format_table, suite_states

    if not args.suite_dir.is_dir():
        return _fail(f"{args.suite_dir}: no such results folder")
    rows = suite_states(args.suite_dir)
    print(format_table(rows))
    return 0


def _cmd_wait(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.jobs import format_table, suite_states

    if not args.suite_dir.is_dir():
        return _fail(f"{args.suite_dir}: no such results folder")
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


def _cmd_rerun(args: argparse.Namespace, argv: list[str]) -> int:
    from pydantic import ValidationError

    from harness.config import RunSpec

    path = args.run_dir / "spec.json"
    try:
        spec = RunSpec.model_validate_json(path.read_text())
    except OSError as exc:
        return _fail(f"{path}: cannot read: {exc.strerror or exc}")
    except ValidationError as exc:
        e = exc.errors()[0]
        return _fail(f"{path}: {'.'.join(map(str, e['loc'])) or '<top level>'}: {e['msg']}")
    problem = _network_problem([spec])
    if problem:
        return _fail(problem)
    from harness.suite import run_specs

    return _finish(run_specs([spec], args.out, argv=["dtbench", *argv], show_progress=not args.quiet))


def _cmd_report(args: argparse.Namespace, argv: list[str]) -> int:
    if not args.suite_dir.is_dir():
        return _fail(f"{args.suite_dir}: no such results folder")
    from harness.report import write_report

    try:
        index = write_report(args.suite_dir, args.out)
    except ValueError as exc:
        return _fail(str(exc))
    print(f"report written: {index}")
    return 0


def _cmd_net_check(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.network import NetworkError, requirements_problem

    if args.world_size < 2:
        return _fail("net-check: --world-size must be at least 2")
    if args.size_mb <= 0 or args.repeats < 1 or args.tolerance <= 0:
        return _fail("net-check: --size-mb and --tolerance must be positive, --repeats at least 1")
    problem = requirements_problem(args.network)
    if problem:
        return _fail(problem)
    from harness.netcheck import format_table, measure

    try:
        checks = measure(args.network, args.world_size, int(args.size_mb * 2**20), args.repeats)
    except NetworkError as exc:
        return _fail(str(exc))
    except RuntimeError as exc:
        print(f"dtbench: net-check failed: {exc}", file=sys.stderr)
        return 1
    print(format_table(args.network, checks, args.tolerance))
    off = [c for c in checks if not c.within(args.tolerance)]
    if off:
        print(f"{len(off)} probe(s) off the model by more than {args.tolerance:.0%}.")
        return 1
    return 0


def _cmd_list(args: argparse.Namespace, argv: list[str]) -> int:
    from harness import workloads
    from methods import registry

    print("methods:")
    rows = [(n, registry.get(n)) for n in registry.names()]
    width = max(len(n) for n, _ in rows)
    fam = max(len(c.family) for _, c in rows)
    for name, cls in rows:
        print(f"  {name:<{width}}  {cls.family:<{fam}}  {cls.summary}")
    print("workloads:")
    width = max(len(n) for n in workloads.names())
    for name in workloads.names():
        w = workloads.get(name)
        target = f"target {w.target:.2f}" if w.target else "no target"
        print(f"  {name:<{width}}  {w.dataset}; {w.model}; {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
