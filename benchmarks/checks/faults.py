"""Fault-injection sweep: real `dtbench run` processes hit by kills, stops, signals, damaged files, a full disk, a
downed link and a second writer, each at random points, summed up in the table of docs/reliability.md.

    python benchmarks/checks/faults.py [--repeats 3] [--methods ddp,qsgd,gpipe,local] [--cases kill9,sigstop,...]
                                [--seed 0] [--markdown table.md] [--keep]

Every case runs `--repeats` times per method at a random step (the seed makes the points repeatable, not the
machine's timing). A row says what the system did, whether any data was lost (it must be "none"), and the time from
the fault to the run's status.json saying so (detection), median and max. Takes about 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fault_cases as fc  # noqa: E402
from fault_tools import METHODS  # noqa: E402

CASES = {
    "kill9": ("kill -9 of a rank", lambda s, m: fc.rank_signal(s, m, signal.SIGKILL)),
    "sigstop": ("SIGSTOP of a rank", lambda s, m: fc.rank_signal(s, m, signal.SIGSTOP)),
    "sigusr2": ("SIGUSR2 to a rank, then --resume", lambda s, m: fc.stop_and_resume(s, m, signal.SIGUSR2)),
    "sigterm": ("SIGTERM to a rank, then --resume", lambda s, m: fc.stop_and_resume(s, m, signal.SIGTERM)),
    "kill-in-checkpoint": ("kill -9 of the writer during checkpoints, then --resume", fc.kill_in_checkpoint),
    "corrupt-checkpoint": ("64 zero bytes in checkpoint.pt, then --resume",
                           lambda s, m: fc.damaged_checkpoint(s, m, "corrupt")),
    "truncated-checkpoint": ("checkpoint.pt cut in half, then --resume",
                             lambda s, m: fc.damaged_checkpoint(s, m, "truncat")),
    "truncated-line": ("a metrics.jsonl line cut in half, then report",
                       lambda s, m: fc.damaged_metrics(s, m, "truncated")),
    "garbage-line": ("a garbage line in metrics.jsonl, then report", lambda s, m: fc.damaged_metrics(s, m, "garbage")),
    "full-disk": ("--out on a full disk (256 KiB tmpfs)", fc.full_disk),
    "link-down": ("the emulated link of rank 1 down mid-run", fc.link_down),
    "shared-folder": ("two dtbench run into one results folder at once", fc.shared_folder),
}
#: Cases about files or folders, not about a method's ranks: one method is enough.
ONE_METHOD = {"truncated-line", "garbage-line", "full-disk", "link-down", "shared-folder"}


def _pattern(outcome: str) -> str:
    """An outcome with its numbers (steps, seconds, pids) folded, so that repeats of one behaviour count together."""
    return re.sub(r"\d+(\.\d+)?", "N", outcome)


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="tries per case and method (default 3)")
    parser.add_argument("--methods", default="ddp,qsgd,gpipe,local", help="comma-separated (default: all four)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    parser.add_argument("--seed", type=int, default=0, help="seed of the random fault points (default 0)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (printed) for inspection")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES] + [m for m in methods if m not in METHODS]
    if unknown or args.repeats < 1:
        parser.error(f"unknown case or method {unknown}" if unknown else "--repeats must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="dtbench-faults-"))
    sweep = fc.Sweep(work, random.Random(args.seed), {})
    rows = []
    started = time.monotonic()
    try:
        for case in cases:
            title, run = CASES[case]
            for method in methods[:1] if case in ONE_METHOD else methods:
                outcomes = []
                for i in range(args.repeats):
                    outcome = run(sweep, method)
                    outcomes.append(outcome)
                    print(f"[{time.monotonic() - started:6.0f} s] {case} {method} #{i + 1}: {outcome.outcome} | "
                          f"lost: {outcome.lost} | detected in: {outcome.detect_s}", flush=True)
                rows.append(_row(title, method, outcomes))
    finally:
        if args.keep:
            print(f"scratch folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    table = _table(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


def _row(title: str, method: str, outcomes: list[fc.Outcome]) -> dict:
    tried = [o for o in outcomes if o.lost != "not tried"]
    kinds = Counter(_pattern(o.outcome) for o in tried)
    example = {_pattern(o.outcome): o.outcome for o in tried}
    described = "; ".join(f"{n}x {example[k]}" for k, n in kinds.most_common())
    lost = sorted({o.lost for o in tried if o.lost != "none"})
    return {"case": title, "method": method, "tried": f"{len(tried)}/{len(outcomes)}",
            "outcomes": described or "; ".join(o.outcome for o in outcomes), "lost": "; ".join(lost) or "none",
            "detect": _seconds([o.detect_s for o in tried if o.detect_s is not None]),
            "ok": bool(tried) and not lost}


def _table(rows: list[dict]) -> str:
    lines = ["| case | method | runs tried | outcomes | data lost | detection s (median / max) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        outcomes = r["outcomes"].replace("|", "/")
        lines.append(f"| {r['case']} | {r['method']} | {r['tried']} | {outcomes} | {r['lost']} | {r['detect']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
