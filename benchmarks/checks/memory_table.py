"""Plan against the allocator for a suite's runs (suites/memory-allocator.toml): a markdown table per method and
workload of the worst rank's plan, allocator peak and ratio, and the ranks outside [1, 1.10]."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.bytesize import format_bytes
from harness.report.plan_check import MAX_RATIO, rank_checks

SUITE = Path(__file__).resolve().parents[2] / "suites" / "memory-allocator.toml"


def table(suite_dir: Path) -> tuple[list[str], int]:
    """The table's lines and the number of ranks outside [1, MAX_RATIO] (a run without both numbers counts one)."""
    lines = ["| method | workload | ranks | plan (worst rank) | allocator peak | plan / peak | each rank's plan / "
             "peak |", "|---|---|---|---|---|---|---|"]
    bad = 0
    for run in sorted(p for p in suite_dir.iterdir() if (p / "spec.json").exists()):
        checks = rank_checks(run)
        if not checks:
            lines.append(f"| {run.name} | – | – | – | – | – | no plan or no allocator peak |")
            bad += 1
            continue
        worst = max(checks, key=lambda c: abs(c.ratio - (1 + MAX_RATIO) / 2))
        bad += sum(not c.ok for c in checks)
        ratios = " ".join(f"{c.ratio:.3f}{'' if c.ok else '!'}" for c in checks)
        lines.append(f"| {worst.method} | {worst.workload} | {len(checks)} | {format_bytes(worst.planned['total'])} "
                     f"| {format_bytes(worst.peak)} | {worst.ratio:.3f} | {ratios} |")
    return lines, bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, nargs="?",
                        help="the suite's results folder, e.g. results/memory-allocator (with --run and without it: "
                             "a temporary folder)")
    parser.add_argument("--run", action="store_true", help=f"first run {SUITE.name} (its runs matching --only) into "
                        "the results folder's parent, replacing earlier runs")
    parser.add_argument("--only", default="*", metavar="GLOB",
                        help="with --run: the run ids to run (as dtbench run --only)")
    args = parser.parse_args(argv)
    if args.results is None and not args.run:
        parser.error("give the results folder, or --run")
    results = args.results or Path(tempfile.mkdtemp(prefix="memory-table-")) / "memory-allocator"
    if args.run:
        subprocess.run([sys.executable, "-m", "harness.cli", "run", str(SUITE), "--out", str(results.parent),
                        "--only", args.only, "--overwrite", "--quiet"], check=True)
    if not results.is_dir() or not any((p / "spec.json").exists() for p in results.iterdir()):
        print(f"memory_table: no run folders in {results}", file=sys.stderr)
        return 2
    lines, bad = table(results)
    print("\n".join(lines))
    print(f"\n{bad} rank(s) outside [1, {MAX_RATIO}] ('!')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
