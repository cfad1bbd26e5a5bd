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
                    "gives its why) and requires (controls that must PASS)) and judge each claim on SUITE_DIR's "
                    "runs: the method's and the baseline's runs are paired by workload, network and seed, and the "
                    "ratio of their means (or the mean of their differences) gets a 95% paired bootstrap "
                    "interval over the pairs where both reached the target. A run that missed it has a time "
                    "censored at its train time: PASS needs the relation to hold with every censored time at its "
                    "worst, FAIL needs it broken at its best. PASS when the whole interval satisfies the relation, "
                    "FAIL when the whole interval violates it, INCONCLUSIVE otherwise, with fewer than 3 paired "
                    "seeds, for a time judged on runs starved of CPU (noisy), or for a PASS whose required "
                    "controls did not PASS. Prints the verdicts (evidence, design checks and claims that need a "
                    "cluster apart) and writes SUITE_DIR/report/claims.csv.",
        epilog=EPILOG)
    claims.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/smoke")
    claims.add_argument("claims_file", type=Path, metavar="CLAIMS.toml",
                        help="the claim file, e.g. suites/claims-compression.claims.toml")
    claims.add_argument("--out", type=Path, default=None, help="folder for claims.csv (default: SUITE_DIR/report)")
    claims.set_defaults(handler=claims_verb)


def claims_verb(args: argparse.Namespace, argv: list[str]) -> int:
    from harness.claims.evaluate import claims_text, evaluate_claims
    from harness.claims.model import load_claims
    from harness.report import hygiene, tables
    from harness.report.csvfile import write_csv
    from harness.results import load_suite
    from harness.suite.files import FileError

    try:
        claim_file = load_claims(args.claims_file)
    except FileError as exc:
        return fail(str(exc))
    if not args.suite_dir.is_dir():
        return fail(f"{args.suite_dir}: no such results folder")
    runs = load_suite(args.suite_dir)
    if not runs:
        return fail(f"{args.suite_dir}: no runs found (no */spec.json)")
    table = tables.summary(runs)
    try:
        verdicts = evaluate_claims(table, claim_file, args.claims_file)
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
