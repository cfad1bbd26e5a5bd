"""`dtbench claims`: judge a claim file's paper claims on a suite's results (PASS / FAIL / INCONCLUSIVE)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.common import fail

EPILOG = ("Exit codes: 0 no claim FAILed; 1 some claim FAILed; 2 bad input (a bad claim file, a claim naming no run, "
          "no runs in the folder): one line naming the file and the field, and nothing written.")


def add(verbs) -> None:
    claims = verbs.add_parser(
        "claims", help="judge paper claims on a suite's results (PASS / FAIL / INCONCLUSIVE)",
        description="Read a claim file (TOML, docs/claims.md: [[claim]] tables with id, source, statement, setting, "
                    "metric (a summary.csv column), method, baseline, relation (ratio_le, ratio_ge, diff_le, "
                    "diff_ge, absdiff_le) and value; optional kind (evidence, design, cluster: a cluster claim "
                    "gives its why) and requires (controls that must PASS); an optional [sequential] max_seeds) "
                    "and judge each claim on SUITE_DIR's runs: the method's and the baseline's runs are paired by "
                    "workload, network and seed; the estimate is the geometric mean of the per-seed ratios (or the "
                    "mean difference), with a paired Student-t interval on the log ratios (or differences), 95% "
                    "for one look at every pair. A run that missed the target has a time censored at its train "
                    "time: PASS needs the relation to hold with every censored time at its worst, FAIL needs it "
                    "broken at its best; a diverged run never reaches it. PASS when the whole interval satisfies "
                    "the relation, FAIL when the whole interval violates it, INCONCLUSIVE otherwise, with fewer "
                    "than 3 paired seeds, for a time judged on runs starved of CPU (noisy), or for a PASS whose "
                    "required controls did not PASS. Prints the verdicts (evidence, design checks and claims that "
                    "need a cluster apart) and writes SUITE_DIR/report/claims.csv.",
        epilog=EPILOG)
    claims.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/smoke")
    claims.add_argument("claims_file", type=Path, metavar="CLAIMS.toml",
                        help="the claim file, e.g. suites/claims-compression.claims.toml")
    claims.add_argument("--out", type=Path, default=None, help="folder for claims.csv (default: SUITE_DIR/report)")
    claims.add_argument("--until-decided", action="store_true",
                        help="run more seeds of the runs behind undecided claims, into SUITE_DIR like the suite's "
                             "own seeds, and judge again, until every claim is decided or the design's last look "
                             "is reached. The looks (3 seeds, then doubling up to the maximum) each get a "
                             "Bonferroni share of the error, so looking again does not inflate it "
                             "(docs/claims.md). Needs a maximum: --max-seeds or the claim file's [sequential]")
    claims.add_argument("--max-seeds", type=int, metavar="N",
                        help="with --until-decided: at most N seeds per run (N >= 3), instead of the claim file's "
                             "[sequential] max_seeds. The page judges with the file's design: put it there to "
                             "keep the two alike")
    claims.add_argument("--quiet", action="store_true", help="with --until-decided: no progress bars")
    claims.set_defaults(handler=claims_verb)


def claims_verb(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.claims.display import claims_text
    from harness.claims.evaluate import evaluate_claims
    from harness.claims.model import Sequential, load_claims
    from harness.report import hygiene, tables
    from harness.report.csvfile import write_csv
    from harness.results import load_suite
    from harness.suite.files import FileError

    if args.max_seeds is not None and not args.until_decided:
        return fail("--max-seeds: only with --until-decided (a design for judging alone goes in the claim file's "
                    "[sequential] table)")
    if args.max_seeds is not None and args.max_seeds < 3:
        return fail(f"--max-seeds {args.max_seeds}: at least 3 (the first look)")
    try:
        claim_file = load_claims(args.claims_file)
    except FileError as exc:
        return fail(str(exc))
    design = (Sequential(max_seeds=args.max_seeds).design() if args.max_seeds is not None else claim_file.design())
    if args.until_decided and design is None:
        return fail(f"{args.claims_file}: --until-decided needs a maximum: --max-seeds N, or [sequential] max_seeds "
                    "in the claim file")
    if not args.suite_dir.is_dir():
        return fail(f"{args.suite_dir}: no such results folder")
    runs = load_suite(args.suite_dir)
    if not runs:
        return fail(f"{args.suite_dir}: no runs found (no */spec.json)")
    table = tables.summary(runs)
    try:
        verdicts = evaluate_claims(table, claim_file, args.claims_file, design)  # a claim naming no run: exit 2 now
        if args.until_decided:
            table, verdicts = _until_decided(args, argv, claim_file, design, (table, verdicts))
    except FileError as exc:
        return fail(str(exc))
    out = args.out if args.out is not None else args.suite_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_csv(verdicts, out / "claims.csv")
    except OSError as exc:  # e.g. a file where the folder goes
        return fail(f"{exc.filename or out}: cannot write claims.csv: {exc.strerror or exc}")
    warning = hygiene.noisy_warning(table)
    if warning:
        print(f"dtbench: warning: {warning}", file=sys.stderr)
    print(claims_text(verdicts))
    print(f"claims written: {out / 'claims.csv'}")
    return 1 if (verdicts["verdict"] == "FAIL").any() else 0


def _until_decided(args: argparse.Namespace, argv: list[str], claim_file, design, judged):
    """--until-decided from `judged` (the summary and its verdicts): the suite file's specs with more seeds, run into
    the suite's folder -> the last (summary, verdicts). FileError: why not."""
    from harness.claims.more_seeds import suite_file_of, until_decided
    from harness.launch import warm
    from harness.launch.lock import FolderBusy, suite_lock
    from harness.launch.suite import run_specs
    from harness.suite.compare import against_suite
    from harness.suite.expand import expand_suite
    from harness.suite.files import FileError
    from harness.suite.schema import load_suite_file

    stored = [(p.parent.name, p.read_text(encoding="utf-8")) for p in sorted(args.suite_dir.glob("*/spec.json"))]
    suite_file = suite_file_of(args.suite_dir, stored)
    stale, problem = against_suite(suite_file, stored)
    if problem or stale:
        raise FileError(problem or f"{args.suite_dir / stale[0][0]}: not what {suite_file} asks for now "
                                   f"({stale[0][1]}): added seeds would not be seeds of the same runs; rerun the "
                                   "suite with --resume first")
    suite_seeds = list(load_suite_file(suite_file)[0].seeds)
    out = args.suite_dir.parent
    warm.start()

    def run(specs) -> None:
        try:
            with suite_lock(args.suite_dir) as lock_fd:
                run_specs(specs, out, resume=True, argv=["dtbench", *argv], suite_file=suite_file,
                          show_progress=not args.quiet, lock_fd=lock_fd)
        except FolderBusy as exc:
            raise FileError(str(exc)) from None

    return until_decided(args.suite_dir, claim_file, args.claims_file, design, judged,
                         lambda seeds: expand_suite(suite_file, seeds=seeds), suite_seeds, run,
                         lambda line: print(f"dtbench claims: {line}", file=sys.stderr))
