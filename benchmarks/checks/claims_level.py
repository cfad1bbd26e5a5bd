"""Print the claims' level and power table (docs/claims.md) from the verdict rule's simulation.

    python benchmarks/checks/claims_level.py [--replicates 4000]

For `ratio_le 1` and `diff_ge 0`, at per-seed CVs of 2%, 10% and 30%, with 3, 5 and 10 seeds and with the sequential
design of at most 10 seeds (looks at 3, 6, 10, Bonferroni): how often PASS, FAIL and INCONCLUSIVE come out with the
true value on the threshold, and the power with the truth 20% past it on either side (harness/claims/level.py;
tests/claims/test_claims_level.py holds every cell to at most 3.5%). A markdown table on stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicates", type=int, default=None, help="simulated claims per cell (default 4000)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from harness.claims.level import REPLICATES, level_table

    replicates = args.replicates or REPLICATES
    print(f"{replicates} replicates per cell; truth on the threshold: PASS / FAIL / INCONCLUSIVE; power: the right "
          "verdict with the truth 20% past the threshold on its failing side (FAIL) or its passing side (PASS)\n")
    print("| claim | per-seed CV | seeds | PASS | FAIL | INCONCLUSIVE | power: FAIL, truth 20% on the failing side "
          "| power: PASS, truth 20% on the passing side |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in level_table(replicates):
        print(f"| `{row['relation']}` | {row['cv']:.0%} | {row['seeds']} | {row['pass']:.1%} | {row['fail']:.1%} | "
              f"{row['inconclusive']:.1%} | {row['power_fail_20']:.1%} | {row['power_pass_20']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
