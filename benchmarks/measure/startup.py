"""Start-up cost of `dtbench run`, interleaved: this tree against a baseline tree, or against spawned ranks.

Each case is a whole `dtbench run --quiet` in a fresh interpreter, as asv's `runner.RunStartup` and
`runner.SuiteStartup` time it: `sgd` (a 1-step run on 1 rank), `ddp` (1 step, 2 ranks), `suite10` (ten 1-step
runs: sgd and ddp x 5 seeds) and `digits` (a 1-step ddp run on digits-mlp, whose data comes through sklearn). Within
a round every variant runs every case, in an order reversed every other round, so that the machine's load hits
all variants alike; the per-round ratio to the first variant cancels most of it. Besides wall time it counts the CPU
seconds of every process a run starts (the launcher, the forkserver, the ranks; this script adopts the orphans to
reap them), which the machine's load hardly changes.

    python benchmarks/measure/startup.py [--rounds 3] [--baseline TREE] [--spawn] [--torch]
        [--cases sgd,ddp,suite10,digits]

Variants: `warm` (this tree), `spawn` (this tree with DTBENCH_START_METHOD=spawn: every rank a fresh interpreter)
and `baseline` (the code of TREE, e.g. a `git worktree add /tmp/base main` of the commit before). It prints each
variant's median wall and CPU seconds per case, the median per-round ratio to the first variant, and the ranks'
start-up phases (the `startup` records of metrics.jsonl) of the last round's runs. With --torch, each case is also
set over two floors timed in the same rounds (FLOORS): a bare `import torch`, and a fresh interpreter's one
torch.optim.SGD step, which no run that trains with torch's optimizers can undercut.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "asv"))

from startup_suite import write_suite  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h

CASES = {"sgd": (["sgd"], 1, "synthetic-mlp"), "ddp": (["ddp"], 1, "synthetic-mlp"),
         "suite10": (["sgd", "ddp"], 5, "synthetic-mlp"), "digits": (["ddp"], 1, "digits-mlp")}


def adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux), so that the CPU time of every process a run
    starts, forkserver and ranks included, is counted in this process's RUSAGE_CHILDREN once they are reaped."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(tree: Path, env: dict[str, str], suite: Path, out: Path) -> tuple[float, float]:
    """Seconds of one `dtbench run SUITE --quiet` of the code in `tree`, from process start to exit, and the CPU
    seconds of every process it started (reaped after it exits)."""
    shutil.rmtree(out, ignore_errors=True)
    cpu = children_cpu_s()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(out), "--quiet"],
                   check=True, env={**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg", **env},
                   cwd=suite.parent, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    while True:  # the orphans: a forkserver ends once its launcher has, a resource tracker too
        try:
            os.wait()
        except ChildProcessError:
            break
    return wall, children_cpu_s() - cpu


#: The floors a run stands on, each a fresh interpreter: `import torch`; and the least any training step with
#: torch's optimizers costs, one SGD step after importing torch and torch.distributed (a torch.optim step imports
#: torch._dynamo, in torch 2.x: `_use_grad_for_differentiable`).
FLOORS = {
    "import torch": "import torch",
    "torch step": "import torch, torch.distributed\n"
                  "model = torch.nn.Linear(32, 10)\n"
                  "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                  "model(torch.randn(4, 32)).sum().backward()\n"
                  "optimizer.step()\n",
}


def floor_s(code: str) -> float:
    """Seconds of a fresh interpreter that runs `code` and exits."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def time_floors(floors: dict[str, list[float]], index: int) -> None:
    """Time each floor of `floors` once more (none without --torch) for round `index`, appending to its list; the
    floors' order is reversed every other time they are timed."""
    names = list(floors) if index % 4 < 2 else list(reversed(floors))
    for name in names:
        floors[name].append(floor_s(FLOORS[name]))


def phases(out: Path) -> dict[str, float]:
    """The slowest rank's seconds per start-up phase, summed over the runs under `out` (empty for trees without
    `startup` records)."""
    total: dict[str, float] = {}
    for metrics in out.glob("*/*/metrics.jsonl"):
        per_run: dict[str, float] = {}
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "startup":
                for name, seconds in record["seconds_by_phase"].items():
                    per_run[name] = max(per_run.get(name, 0.0), seconds)
        for name, seconds in per_run.items():
            total[name] = total.get(name, 0.0) + seconds
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="TREE", help="another source tree to measure alongside")
    parser.add_argument("--spawn", action="store_true", help="also measure this tree with spawned ranks")
    parser.add_argument("--cases", default="sgd,ddp,suite10,digits", help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--torch", action="store_true",
                        help="also time, in every round and interleaved with the runs, a bare `python -c 'import "
                             "torch'` and a fresh interpreter's one torch.optim.SGD step (FLOORS), and print each "
                             "case's time over each (the floors any run with torch's optimizers stands on)")
    args = parser.parse_args()
    variants = {"warm": (ROOT, {})}
    if args.spawn:
        variants["spawn"] = (ROOT, {"DTBENCH_START_METHOD": "spawn"})
    if args.baseline:
        variants["baseline"] = (args.baseline.resolve(), {})
    cases = args.cases.split(",")
    folder = Path(tempfile.mkdtemp(prefix="dtbench-startup-"))
    suites = {}
    for case in cases:
        (folder / case).mkdir()
        methods, seeds, workload = CASES[case]
        suites[case] = write_suite(folder / case, methods, seeds, workload)
    seconds: dict[tuple[str, str], list[float]] = {(c, v): [] for c in cases for v in variants}
    cpu: dict[tuple[str, str], list[float]] = {(c, v): [] for c in cases for v in variants}
    floors: dict[str, list[float]] = {name: [] for name in FLOORS} if args.torch else {}
    adopt_orphans()
    try:
        for index in range(args.rounds):
            order = list(variants) if index % 2 == 0 else list(reversed(variants))
            if index % 2 == 0:
                time_floors(floors, index)
            for case in cases:
                for name in order:
                    tree, env = variants[name]
                    wall, used = run_once(tree, env, suites[case], folder / case / f"out-{name}")
                    seconds[case, name].append(wall)
                    cpu[case, name].append(used)
            if index % 2 == 1:
                time_floors(floors, index)
            print(f"round {index + 1}/{args.rounds} (load {os.getloadavg()[0]:.2f}): " + ", ".join(
                f"{c} {v} {seconds[c, v][-1]:.2f} s" for c in cases for v in variants), flush=True)
        first = next(iter(variants))
        for title, values in (("wall", seconds), ("CPU (every process of the run)", cpu)):
            print(f"\nmedian {title} seconds over {args.rounds} rounds (load average now {os.getloadavg()[0]:.2f}):")
            for case in cases:
                cells = []
                for name in variants:
                    cell = f"{name} {statistics.median(values[case, name]):.2f}"
                    if name != first:
                        ratios = [a / b for a, b in zip(values[case, name], values[case, first], strict=True)]
                        cell += f" ({statistics.median(ratios):.2f}x {first})"
                    cells.append(cell)
                print(f"  {case:8s} " + "   ".join(cells))
        for name, times in floors.items():
            print(f"\n{name}: median {statistics.median(times):.2f} s; each case over it, the median of the "
                  f"per-round ratios:")
            for case in cases:
                ratios = [a / b for a, b in zip(seconds[case, first], times, strict=True)]
                print(f"  {case:8s} {first} {statistics.median(ratios):.2f}x {name}")
        print("\nranks' start-up phases, last round (slowest rank per run, summed over the runs), seconds:")
        for case in cases:
            for name in variants:
                found = phases(folder / case / f"out-{name}")
                if found:
                    print(f"  {case:8s} {name:8s} " + ", ".join(f"{k} {v:.3f}" for k, v in found.items()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
