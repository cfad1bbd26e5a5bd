"""`dtbench run` and `dtbench rerun`: a suite's runs (local or on SLURM), or one run again from its folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import EPILOG, NETWORK_HELP, fail, finish, network_arg, network_problem


def add(verbs) -> None:
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
    run.add_argument("--seeds", metavar="LIST", type=seeds_arg,
                     help="run these seeds instead of the suite's, e.g. 3,4,5 or 3-9: more seeds of the same runs "
                          "into the same suite folder (the report, the claims and --resume take them as seeds of "
                          "the suite; dtbench claims --until-decided adds seeds this way)")
    again = run.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="keep completed runs whose stored spec.json is the run the suite asks for now (a run "
                            "whose params, budget, workload options, network, memory, seed or threads changed runs "
                            "again, its earlier folder moved aside); continue unfinished runs from their newest "
                            "checkpoint whose sha256 and spec hash verify (checkpoint.pt, else checkpoint.prev.pt), "
                            "else start them over (docs/results.md)")
    again.add_argument("--overwrite", action="store_true",
                       help="run every run again, moving the earlier run folders aside to OUT/<suite>/.earlier/"
                            "<date>/ (never deleted). Without --resume or --overwrite, a suite folder that holds "
                            "completed results of these runs is refused (exit 2)")
    run.add_argument("--dry-run", action="store_true",
                     help="validate and list the runs with their params (those that differ from the method's "
                          "defaults) and what the real run would do with each run's folder under --out (new, "
                          "replaces an earlier run; with --resume: skipped, resumed, started over); write nothing")
    run.add_argument("--quiet", action="store_true", help="no progress bars (the per-run lines still print)")
    run.add_argument("--by-seed", action="store_true",
                     help="run seed by seed: the first seed of every run in file order, then the second, ... "
                          "(default: every seed of a run before the next run); on a machine whose speed drifts, "
                          "the methods a timing compares then share its good and bad minutes")
    run.add_argument("--network", metavar="SPEC", type=network_arg,
                     help=NETWORK_HELP + ". Replaces the suite's [network] and every run's network (run ids and "
                                         "labels then carry it).")
    run.set_defaults(handler=run_suite)

    rerun = verbs.add_parser(
        "rerun", help="run one run again from its run folder alone",
        description="Read RUN_DIR/spec.json (written by every run) and run exactly that spec again into "
                    "OUT/<suite>/<run id>/. No suite file is needed.", epilog=EPILOG)
    rerun.add_argument("run_dir", type=Path, help="a run folder holding spec.json")
    rerun.add_argument("--out", type=Path, default=Path("results/rerun"),
                       help="results folder for the rerun (default: results/rerun)")
    rerun.add_argument("--quiet", action="store_true", help="no progress bar")
    rerun.set_defaults(handler=rerun_one)


def run_suite(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.suite.expand import expand_suite
    from harness.suite.files import FileError

    if args.launcher == "local" and not args.dry_run:
        _warm_up()
    try:
        specs = expand_suite(args.suite, args.only, args.network, launcher=args.launcher, seeds=args.seeds)
    except FileError as exc:
        return fail(str(exc))
    if not specs:
        return fail(f"{args.suite}: no run id matches --only {args.only!r}")
    if args.by_seed:
        seeds = list(dict.fromkeys(s.seed for s in specs))
        specs = sorted(specs, key=lambda s: seeds.index(s.seed))  # stable: file order within a seed
    if args.launcher == "slurm":
        return _submit(args, specs, argv)
    if args.site or args.nodes:
        return fail("--site and --nodes are for --launcher slurm")
    if args.dry_run:
        from harness.cli.dry_run import listing

        print("\n".join(listing(specs, args.out, args.resume, args.overwrite)))
        return 0
    problem = network_problem(specs)
    if problem:
        return fail(problem)
    from harness.launch.lock import FolderBusy, suite_lock
    from harness.launch.suite import ResultsExist, refusal, run_specs

    if not args.resume and not args.overwrite:  # before the lock: a refused run writes nothing
        line = refusal(specs, args.out)
        if line:
            return fail(line)
    try:
        with suite_lock(args.out / specs[0].suite) as lock_fd:
            print(f"suite {specs[0].suite}: {len(specs)} runs -> {args.out / specs[0].suite}")
            outcomes = run_specs(specs, args.out, resume=args.resume, argv=["dtbench", *argv],
                                 suite_file=args.suite, show_progress=not args.quiet, overwrite=args.overwrite,
                                 lock_fd=lock_fd)
    except (FolderBusy, ResultsExist) as exc:
        return fail(str(exc))
    except OSError as exc:  # the results folder cannot be made or written (a file in its place, no permission)
        return fail(f"{exc.filename or args.out}: cannot write the results: {exc.strerror or exc}")
    return finish(outcomes)


def seeds_arg(text: str) -> list[int]:
    """argparse type of --seeds: '3,4,5', '3-9' or a mix ('0,4-6') -> the seeds in that order, each once."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            low, high = int(first), int(last) if last else int(first)
            if not 0 <= low <= high < 2**32 or high - low >= 10_000:
                raise ValueError
            seeds.extend(s for s in range(low, high + 1) if s not in seeds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seeds like 3,4,5 or 3-9 (integers from 0 to "
                                         "2**32 - 1, ranges low-high of at most 10,000)") from None
    return seeds


def _submit(args: argparse.Namespace, specs, argv: list[str]) -> int:
    from harness.launch.sites import load_site
    from harness.suite.files import FileError

    try:
        site = load_site(args.site)
    except FileError as exc:
        return fail(str(exc))
    emulated = [s.run_id for s in specs if s.network is not None]
    if emulated:
        return fail(f"{emulated[0]}: network emulation runs with the local launcher only (a cluster has its own "
                     "network); drop --network and [network] for --launcher slurm")
    if args.nodes is not None:
        bad = [s.run_id for s in specs if args.nodes < 1 or s.world_size % args.nodes]
        if bad:
            return fail(f"--nodes {args.nodes}: does not divide the world size of {bad[0]}")
        specs = [s.model_copy(update={"nodes": args.nodes}) for s in specs]
    if args.dry_run:
        for spec in specs:
            print(f"{spec.run_id}\tnodes={spec.nodes}\ttasks_per_node={spec.world_size // spec.nodes}")
        print(f"{len(specs)} runs; nothing submitted (--dry-run).")
        return 0
    from harness.launch.lock import suite_lock
    from harness.launch.suite import submit_specs

    try:  # FolderBusy and ResultsExist are RuntimeErrors too: another dtbench run is writing to the folder, or it
        # holds completed results and neither --resume nor --overwrite was given
        with suite_lock(args.out / specs[0].suite):
            submitted = submit_specs(specs, args.out, site, resume=args.resume, argv=["dtbench", *argv],
                                     suite_file=args.suite, overwrite=args.overwrite)
    except RuntimeError as exc:
        return fail(str(exc))
    suite_dir = args.out / specs[0].suite
    for item in submitted:
        print(f"{item.spec.run_id}\tjob {item.job_id}")
    print(f"{len(submitted)} runs submitted to SLURM (site {site.name}). Follow them with: dtbench status {suite_dir}"
          f"; block until done with: dtbench wait {suite_dir}")
    return 0


def _warm_up() -> None:
    """Start the ranks' forkserver first: it imports torch and the harness while this process reads the suite
    (which imports torch too), so the two imports overlap (harness/launch/warm.py)."""
    from harness.launch import warm

    warm.start()


def rerun_one(args: argparse.Namespace, argv: list[str]) -> int:
    from pydantic import ValidationError

    from harness.suite.expand import check_spec
    from harness.suite.files import FileError, field_path
    from harness.suite.spec import RunSpec

    _warm_up()
    path = args.run_dir / "spec.json"
    try:
        spec = RunSpec.model_validate_json(path.read_text(encoding="utf-8"))
        spec = check_spec(spec, path)
    except (OSError, UnicodeDecodeError) as exc:
        return fail(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")
    except ValidationError as exc:  # its params are read as its method's here, once: the ranks get them typed
        e = exc.errors()[0]
        return fail(f"{path}: {field_path(e['loc'])}: {e['msg']}")
    except FileError as exc:
        return fail(str(exc))
    problem = network_problem([spec])
    if problem:
        return fail(problem)
    from harness.launch.lock import FolderBusy, suite_lock
    from harness.launch.suite import run_specs

    try:  # a rerun replaces an earlier rerun of the run in --out, moving it aside (never deleted)
        with suite_lock(args.out / spec.suite) as lock_fd:
            outcomes = run_specs([spec], args.out, argv=["dtbench", *argv], show_progress=not args.quiet,
                                 overwrite=True, lock_fd=lock_fd)
    except FolderBusy as exc:
        return fail(str(exc))
    except OSError as exc:  # the results folder cannot be made or written (a file in its place, no permission)
        return fail(f"{exc.filename or args.out}: cannot write the results: {exc.strerror or exc}")
    return finish(outcomes)
