"""`dtbench project`: step time and time to target of a suite's configurations at other world sizes and networks,
from the costs its runs measured, with --validate comparing projections to held-out runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import fail


def add(verbs) -> None:
    project = verbs.add_parser(
        "project", help="project step time and time to target to other world sizes and networks",
        description="Calibrate a cost model on a suite's runs at one network and world size (default: 'unlimited' "
                    "and 2 ranks) and project every configuration to --world-sizes x --network. Data parallel "
                    "(ddp, compressed ddps): per-block compute profiled here at several batch sizes and "
                    "interpolated to the per-rank batch, scaled to what the calibration runs measured; DDP's "
                    "buckets overlapped with the backward; compression's measured compute and payload; ring "
                    "all-reduce / all-gather by the alpha-beta model. Pipelines: the traced step's actions with "
                    "their measured durations and message sizes through a discrete-event simulator (every "
                    "built-in pipeline also at other stage counts: its own steady-state step with per-block "
                    "costs; on more ranks than the model has blocks, copies of the deepest pipeline that fits, "
                    "all-reducing each stage's gradients before its update). Held-out runs whose ranks shared "
                    "a host's cores (--validate) are projected with that sharing. Time to target = projected "
                    "step time x the steps the calibration runs needed (same global batch). Writes projection.csv, "
                    "projection.png and projection.html (a figure per configuration, labelled a projection, with "
                    "its method's validation error beside it) to SUITE_DIR/report/ and prints the table; formulas "
                    "in docs/projection.md.",
        epilog="Exit codes: 0 written; 2 bad input (nothing written). Reading the error bar: with --validate the "
               "median and max |projected/measured - 1| over held-out configurations is how far to trust a "
               "projection of the same kind.")
    project.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/compression-network")
    project.add_argument("--world-sizes", default="2,8,64", metavar="N,N,...",
                         help="ranks (one per node) to project to, comma-separated (default 2,8,64)")
    project.add_argument("--network", default="100mbit,1gbit,10gbit", metavar="RATE,RATE,...",
                         help="link rates per rank and direction to project to, comma-separated, in --network "
                              "units (bit, kbit, mbit, gbit; 'unlimited' = this host's unshaped link) "
                              "(default 100mbit,1gbit,10gbit)")
    project.add_argument("--latency", default="0", metavar="TIME",
                         help="one-way latency alpha per message (us, ms, s), e.g. 20us (default 0)")
    project.add_argument("--unshaped-rate", default="6gbit", metavar="RATE",
                         help="what 'unlimited' and loopback carry between two ranks here (default 6gbit: "
                              "net-check's 10 MiB all_reduce in 14 ms)")
    project.add_argument("--wire-efficiency", type=float, default=None, metavar="F",
                         help="payload share of a shaped rate (default 1448/1514 = 0.956, TCP over Ethernet)")
    project.add_argument("--as-emulated", action="store_true",
                         help="project onto links shaped as this harness's emulation shapes them (tc tbf with its "
                              "burst of at least 96 KiB), to compare with runs; default: links that hold their "
                              "rate from the first byte, like a switch port")
    project.add_argument("--quantile", type=float, default=0.5, metavar="Q",
                         help="which quantile of a run's per-step times (and traced action durations) stands for "
                              "it (default 0.5, the median). On a machine shared with other jobs a low one, e.g. "
                              "0.1, reads each run's least disturbed steps")
    project.add_argument("--calibrate-on", default=None, metavar="NETWORK",
                         help="the network whose runs calibrate (default 'unlimited', else loopback runs)")
    project.add_argument("--calibration-world-size", type=int, default=None, metavar="N",
                         help="the world size whose runs calibrate (default 2, else the smallest)")
    project.add_argument("--validate", action="store_true",
                         help="also project every run not used for calibration (other networks, world sizes, "
                              "splits), print projected against measured step time and time to target with "
                              "their errors, and write projection_validation.csv and .png")
    project.add_argument("--baseline", metavar="LABEL",
                         help="the configuration speed-ups are measured against (default: the first ddp one)")
    project.add_argument("--validation", type=Path, default=None, metavar="PATH",
                         help="where the page's validation errors come from when this suite has no held-out runs "
                              "(or no --validate): a projection_validation.csv, or a results folder holding one in "
                              "report/, e.g. results/projection-ranks after dtbench project --validate on it")
    project.add_argument("--reprofile", action="store_true",
                         help="measure the block costs again instead of reading report/projection_profiles.json")
    project.add_argument("--out", type=Path, default=None, help="output folder (default: SUITE_DIR/report)")
    project.set_defaults(handler=project_verb)


def parse_options(args: argparse.Namespace):
    """The settings, world sizes and networks; ValueError (one line) on bad input."""
    from harness.net.spec import parse_latency, parse_network, parse_rate
    from harness.project.links import WIRE_EFFICIENCY
    from harness.project.suite import Settings

    try:
        sizes = [int(s) for s in args.world_sizes.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--world-sizes {args.world_sizes!r}: give positive integers, e.g. 2,8,64") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--world-sizes {args.world_sizes!r}: give positive integers, e.g. 2,8,64")
    networks = [n.strip().lower() for n in args.network.split(",") if n.strip()]
    for network in networks:
        parse_network(network)
    if not networks:
        raise ValueError("--network: give at least one rate, e.g. 1gbit")
    rate = parse_rate(args.unshaped_rate)
    if rate is None:
        raise ValueError("--unshaped-rate: give a rate, e.g. 6gbit")
    efficiency = WIRE_EFFICIENCY if args.wire_efficiency is None else args.wire_efficiency
    if not 0 < efficiency <= 1:
        raise ValueError("--wire-efficiency: give a number in (0, 1]")
    if not 0 < args.quantile < 1:
        raise ValueError("--quantile: give a number in (0, 1), e.g. 0.5")
    calibrate_on = None
    if args.calibrate_on is not None:
        calibrate_on = "" if args.calibrate_on in ("", "loopback") else parse_network(args.calibrate_on).text
    settings = Settings(parse_latency(args.latency), float(rate), efficiency, calibrate_on,
                        args.calibration_world_size, args.as_emulated,
                        args.quantile)
    return settings, sizes, networks


def project_verb(args: argparse.Namespace, argv: list[str]) -> int:
    if not args.suite_dir.is_dir():
        return fail(f"{args.suite_dir}: no such results folder")
    try:
        settings, sizes, networks = parse_options(args)
    except ValueError as exc:
        return fail(str(exc))
    from harness.project.output import write_projection

    try:
        write_projection(args.suite_dir, args.out or args.suite_dir / "report", settings, sizes, networks,
                         args.baseline, args.validate, args.reprofile, args.validation)
    except ValueError as exc:
        return fail(str(exc))
    return 0
