"""The regression check: compare two asv result sets and exit 1 when a benchmark got slower (or bigger) beyond a factor.

    python benchmarks/asv_tools/regress.py BASELINE CONTENDER [--factor 1.25] [--factor-for 'GLOB=F']
        [--bench REGEX] [--strict]

BASELINE and CONTENDER are commits (their newest results under --results-dir) or paths of asv results files. asv
treats smaller as better for every benchmark (time, memory and the tracked bytes, seconds and ratios), so the ratio
is contender / baseline and a regression is a ratio above the factor. Where both sides carry asv's 99% confidence
intervals (time benchmarks) and the intervals overlap, the change is reported as `noise` and does not fail, as
`asv compare` does; `--strict` fails on the ratio alone. A benchmark that ran in the baseline and fails in the
contender fails the check too. Prints one table row per benchmark and parameter combination.

Exit status: 0 no regression, 1 regression or newly failing benchmark, 2 results missing or unreadable.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from asv_results import ResultsError, find_results, load_results, read_benchmarks

DEFAULT_FACTOR = 1.25
#: Factors of their own for benchmarks noisier than the default allows, applied before --factor-for (which wins):
#: the runner's per-step cost is a difference of two step times of about 3 ms, and unchanged code gave 65 to 240 us
#: for it in back-to-back runs on the shared 2-core VM (docs/benchmarks.md); its CPU-time peer keeps the default.
BENCHMARK_FACTORS: tuple[tuple[str, float], ...] = (("runner.RunnerCost.track_runner_cost_per_step", 3.0),)
FAILING = ("regression", "failed")
#: Row order of the printed table: what needs attention first.
STATUS_ORDER = ("regression", "failed", "noise", "improved", "fixed", "new", "missing", "ok", "n/a")


def factor_for(benchmark: str, factor: float, overrides: Sequence[tuple[str, float]] = ()) -> float:
    """The threshold of one benchmark: the last override whose glob matches its name, else `factor`."""
    chosen = factor
    for pattern, value in overrides:
        if fnmatch.fnmatchcase(benchmark, pattern):
            chosen = value
    return chosen


def _ratio(baseline: float, contender: float) -> float:
    if baseline == 0:
        return 1.0 if contender == 0 else math.inf
    return contender / baseline


def _overlap(row: pd.Series) -> bool:
    """True when both sides have a confidence interval and the two intervals overlap."""
    bounds = [row["ci_low_base"], row["ci_high_base"], row["ci_low_new"], row["ci_high_new"]]
    if any(math.isnan(b) for b in bounds):
        return False
    return row["ci_low_new"] <= row["ci_high_base"] and row["ci_low_base"] <= row["ci_high_new"]


def classify(row: pd.Series, factor: float, strict: bool = False) -> str:
    """The status of one compared row (columns value_base, value_new and the ci_ bounds of both)."""
    in_base, in_new = row["in_base"], row["in_new"]
    if not in_base:
        return "new"
    if not in_new:
        return "missing"
    base_ok, new_ok = math.isfinite(row["value_base"]), math.isfinite(row["value_new"])
    if not base_ok and not new_ok:
        return "n/a"
    if not new_ok:
        return "failed"
    if not base_ok:
        return "fixed"
    ratio = row["ratio"]
    if ratio > factor or ratio < 1 / factor:
        if not strict and _overlap(row):
            return "noise"
        return "regression" if ratio > factor else "improved"
    return "ok"


def compare(baseline: pd.DataFrame, contender: pd.DataFrame, factor: float = DEFAULT_FACTOR,
            overrides: Sequence[tuple[str, float]] = (), strict: bool = False,
            bench: Sequence[str] = ()) -> pd.DataFrame:
    """Two `load_results` tables -> one row per benchmark and params in either, with ratio, factor and status.

    `bench`: regular expressions (re.search on the benchmark name, as `asv run --bench`); when given, only
    matching benchmarks are compared.
    """
    keys = ["benchmark", "params"]
    base = baseline.assign(in_base=True)
    new = contender.assign(in_new=True)
    merged = base.merge(new, on=keys, how="outer", suffixes=("_base", "_new"))
    if bench:
        merged = merged[merged["benchmark"].map(lambda name: any(re.search(p, name) for p in bench))]
    merged["in_base"] = merged["in_base"].astype("boolean").fillna(False).astype(bool)
    merged["in_new"] = merged["in_new"].astype("boolean").fillna(False).astype(bool)
    for column in ("value", "ci_low", "ci_high"):
        for side in ("base", "new"):
            merged[f"{column}_{side}"] = pd.to_numeric(merged[f"{column}_{side}"]).fillna(math.nan)
    merged["unit"] = merged["unit_new"].fillna(merged["unit_base"])
    merged["ratio"] = [_ratio(b, n) if math.isfinite(b) and math.isfinite(n) else math.nan
                       for b, n in zip(merged["value_base"], merged["value_new"], strict=True)]
    merged["factor"] = [factor_for(name, factor, [*BENCHMARK_FACTORS, *overrides]) for name in merged["benchmark"]]
    merged["status"] = [classify(row, row["factor"], strict) for _, row in merged.iterrows()]
    table = merged[keys + ["unit", "value_base", "value_new", "ratio", "factor", "status"]]
    table = table.rename(columns={"value_base": "baseline", "value_new": "contender"})
    order = {status: index for index, status in enumerate(STATUS_ORDER)}
    return table.sort_values(by=["status", "benchmark", "params"],
                             key=lambda col: col.map(order) if col.name == "status" else col).reset_index(drop=True)


def human(value: float, unit: str) -> str:
    """12.3 ms, 546 MB, 0.127 x fp32: a value with its unit at 3-4 significant digits; '-' when missing."""
    if not math.isfinite(value):
        return "-"
    if unit == "seconds":
        for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
            if abs(value) >= scale or scale == 1e-6:
                return f"{value / scale:.3g} {suffix}"
    if unit == "bytes":
        for scale, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {suffix}"
        return f"{value:.0f} B"
    return f"{value:.4g} {unit}".strip()


def render(table: pd.DataFrame) -> str:
    """The comparison as a fixed-width text table."""
    rows = [("status", "ratio", "baseline", "contender", "benchmark")]
    for _, row in table.iterrows():
        ratio = f"{row['ratio']:.3f}" if math.isfinite(row["ratio"]) else "-"
        name = row["benchmark"] + (f" ({row['params']})" if row["params"] else "")
        rows.append((row["status"], ratio, human(row["baseline"], row["unit"]),
                     human(row["contender"], row["unit"]), name))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        lines.append("  ".join([r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in (1, 2, 3)] + [r[4]]))
    return "\n".join(lines)


def _override(text: str) -> tuple[str, float]:
    pattern, _, value = text.rpartition("=")
    try:
        factor = float(value)
    except ValueError:
        factor = math.nan
    if not pattern or not factor > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected GLOB=FACTOR with FACTOR > 1, e.g. '*ratio_to_copy*=1.5'")
    return pattern, factor


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a factor > 1, e.g. 1.25")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", help="commit-ish or path of an asv results file")
    parser.add_argument("contender", help="commit-ish or path of an asv results file")
    parser.add_argument("--factor", type=_factor, default=DEFAULT_FACTOR,
                        help=f"a ratio above this is a regression (default {DEFAULT_FACTOR})")
    parser.add_argument("--factor-for", type=_override, action="append", default=[], metavar="GLOB=FACTOR",
                        help="another factor for benchmarks whose name matches GLOB (repeatable; last match wins)")
    parser.add_argument("--bench", action="append", default=[], metavar="REGEX",
                        help="compare only benchmarks whose name matches (repeatable), as `asv run --bench`")
    parser.add_argument("--strict", action="store_true",
                        help="judge by the ratio alone, even where the confidence intervals overlap")
    parser.add_argument("--results-dir", default=".asv/results", help="asv's results folder (default .asv/results)")
    parser.add_argument("--machine", help="asv machine name (default: any, the newest results)")
    parser.add_argument("--all", action="store_true", help="print every row, not only those that changed")
    args = parser.parse_args(argv)

    benchmarks = read_benchmarks(Path(args.results_dir) / "benchmarks.json")
    try:
        paths = [find_results(ref, args.results_dir, args.machine) for ref in (args.baseline, args.contender)]
        baseline, contender = (load_results(path, benchmarks or None) for path in paths)
    except ResultsError as err:
        print(f"regress: {err}", file=sys.stderr)
        return 2
    table = compare(baseline, contender, args.factor, args.factor_for, args.strict, args.bench)
    for role, ref, path in (("baseline ", args.baseline, paths[0]), ("contender", args.contender, paths[1])):
        print(f"{role}: {path}" if Path(ref) == path else f"{role}: {ref} -> {path}")
    print(f"ratio = contender / baseline, smaller is better; regression above {args.factor:g}x"
          + "".join(f", {pattern} above {value:g}x" for pattern, value in [*BENCHMARK_FACTORS, *args.factor_for]))
    shown = table if args.all else table[table["status"] != "ok"]
    print(render(shown) if len(shown) else "(every benchmark within its factor)")
    counts = table["status"].value_counts()
    print(", ".join(f"{counts[s]} {s}" for s in STATUS_ORDER if s in counts))
    failing = table[table["status"].isin(FAILING)]
    if len(failing):
        print(f"FAILED: {len(failing)} benchmark(s) regressed beyond their factor or started failing")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
