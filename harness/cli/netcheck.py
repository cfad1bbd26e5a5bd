"""`dtbench net-check`: an emulated network measured against the ring all-reduce model."""

from __future__ import annotations

import argparse
import sys

from harness.cli.common import NETWORK_HELP, fail, network_arg


def add(verbs) -> None:
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
    check.add_argument("--network", metavar="SPEC", type=network_arg, required=True, help=NETWORK_HELP)
    check.add_argument("--world-size", type=int, default=2, metavar="N", help="number of ranks (default 2)")
    check.add_argument("--size-mb", type=float, default=10.0, metavar="MIB",
                       help="payload of both probes in MiB (default 10)")
    check.add_argument("--repeats", type=int, default=3, help="timed repetitions per probe (default 3)")
    check.add_argument("--tolerance", type=float, default=0.25,
                       help="largest accepted |measured/model - 1| (default 0.25)")
    check.set_defaults(handler=net_check)


def net_check(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.net.emulation import requirements_problem
    from harness.net.namespaces import NetworkError

    if args.world_size < 2:
        return fail("net-check: --world-size must be at least 2")
    if args.size_mb <= 0 or args.repeats < 1 or args.tolerance <= 0:
        return fail("net-check: --size-mb and --tolerance must be positive, --repeats at least 1")
    problem = requirements_problem(args.network)
    if problem:
        return fail(problem)
    from harness.net.check import format_table, measure

    try:
        checks = measure(args.network, args.world_size, int(args.size_mb * 2**20), args.repeats)
    except NetworkError as exc:
        return fail(str(exc))
    except RuntimeError as exc:
        print(f"dtbench: net-check failed: {exc}", file=sys.stderr)
        return 1
    print(format_table(args.network, checks, args.tolerance))
    off = [c for c in checks if not c.within(args.tolerance)]
    if off:
        print(f"{len(off)} probe(s) off the model by more than {args.tolerance:.0%}.")
        return 1
    return 0
