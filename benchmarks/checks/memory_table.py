"""Plan against the allocator for a suite's runs (suites/memory-allocator.toml): a markdown table per method and
workload of the worst rank's plan, allocator peak and ratio, and the ranks outside [1, 1.10]."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.bytesize import format_bytes
from harness.report.plan_check import MAX_RATIO, rank_checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("suite_dir", type=Path, help="a suite's results folder, e.g. results/memory-allocator")
    args = parser.parse_args(argv)
    runs = sorted(p for p in args.suite_dir.iterdir() if (p / "spec.json").exists())
    if not runs:
        print(f"memory_table: no run folders in {args.suite_dir}", file=sys.stderr)
        return 2
    print("| method | workload | ranks | plan (worst rank) | allocator peak | plan / peak | each rank's plan / peak |")
    print("|---|---|---|---|---|---|---|")
    bad = 0
    for run in runs:
        checks = rank_checks(run)
        if not checks:
            print(f"| {run.name} | – | – | – | – | – | no plan or no allocator peak |")
            bad += 1
            continue
        worst = max(checks, key=lambda c: abs(c.ratio - 1.05))
        bad += sum(not c.ok for c in checks)
        ratios = " ".join(f"{c.ratio:.3f}{'' if c.ok else '!'}" for c in checks)
        print(f"| {worst.method} | {worst.workload} | {len(checks)} | {format_bytes(worst.planned['total'])} | "
              f"{format_bytes(worst.peak)} | {worst.ratio:.3f} | {ratios} |")
    print(f"\n{bad} rank(s) outside [1, {MAX_RATIO}] ('!')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
