"""APapo's study (suites/apapo.toml): run it with the seeds interleaved, then summarise throughput, time to target,
final accuracy, speed-ups over the other methods and the communication hidden by overlap, per set-up.

    python benchmarks/measure/apapo_study.py run [--out results]        # seed 0 of every run, then seed 1, then seed 2
    python benchmarks/measure/apapo_study.py summarize results/apapo     # after `dtbench report results/apapo`
    python benchmarks/measure/apapo_study.py delay                       # the delayed update's accuracy, one process
    python benchmarks/measure/apapo_study.py handling                    # delay handlings simulated on one process

`run` prints `uptime` before each pass (other work on the machine changes every timing) and writes the report.
`summarize` prints markdown: per label the mean (and spread over seeds) of samples/s, time to target and final
accuracy; apapo's throughput over every other method's, seed by seed, in each set-up; and per apapo run the overlap
accounting of partition.json, with the exposed communication of overlap on against off.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

SUITE = Path(__file__).resolve().parents[2] / "suites" / "apapo.toml"


def run_ids(seed: int) -> list[str]:
    """The suite's run ids of one seed, in the suite's order (from `dtbench run --dry-run`)."""
    listing = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(SUITE), "--dry-run"],
                             capture_output=True, text=True, check=True).stdout
    return [line.split("\t")[0] for line in listing.splitlines() if line.endswith(f"\tseed={seed}")]


def run(out: str, seeds: list[int]) -> None:
    """Seed by seed, every run in the suite's order (so that load on a shared machine spreads over the methods);
    `uptime` before each run; runs already completed are skipped (--resume)."""
    for seed in seeds:
        for run_id in run_ids(seed):
            print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
            subprocess.run([sys.executable, "-m", "harness.cli", "run", str(SUITE), "--out", out, "--quiet",
                            "--resume", "--only", run_id], check=False)
    subprocess.run([sys.executable, "-m", "harness.cli", "report", str(Path(out) / "apapo")], check=True)


BASELINES = ("sgd", "ddp", "gpipe", "1f1b", "pipedream")


def setup_of(label: str) -> str:
    return ("unequal ranks (3 ranks: CPU 0 | CPU 1 | CPU 1)" if label.endswith("hetero")
            else "equal ranks (2 ranks, one core each)")


def method_of(label: str) -> str:
    """'apapo pipeline x2 hetero' -> 'apapo pipeline'; default labels lose their bookkeeping params too."""
    name = re.sub(r" x\d+$", "", label.removesuffix(" hetero"))
    return re.sub(r" (trace_steps|microbatches)=\d+", "", name)


def summarize(suite_dir: Path) -> str:
    table = pd.read_csv(suite_dir / "report" / "summary.csv")
    table = table[table["state"] == "completed"].copy()
    table["setup"], table["name"] = table["label"].map(setup_of), table["label"].map(method_of)
    lines = []
    for setup, group in table.groupby("setup", sort=False):
        lines += [f"### {setup}", "", "| method | runs | samples/s | time to 0.95 (s) | final accuracy |",
                  "| --- | --- | --- | --- | --- |"]
        for name, rows in group.groupby("name", sort=False):
            tt = rows["time_to_target_s"]
            lines.append(f"| {name} | {len(rows)} | {rows['samples_per_s'].mean():.0f} ± "
                         f"{rows['samples_per_s'].std():.0f} | {tt.mean():.2f} ({tt.notna().sum()}/{len(rows)} "
                         f"reached) | {rows['final_accuracy'].mean():.3f} |")
        lines += ["", "throughput of each apapo variant over each baseline's, seed by seed: mean [min, max]", "",
                  "| apapo variant | " + " | ".join(b for b in BASELINES if b in set(group["name"])) + " |",
                  "| --- |" + " --- |" * len([b for b in BASELINES if b in set(group["name"])])]
        for name, rows in group.groupby("name", sort=False):
            if not name.startswith("apapo"):
                continue
            mine = rows.set_index("seed")["samples_per_s"]
            cells = []
            for baseline in BASELINES:
                other = group[group["name"] == baseline].set_index("seed")["samples_per_s"]
                if len(other):
                    ratio = (mine / other).dropna()
                    cells.append(f"{ratio.mean():.2f} [{ratio.min():.2f}, {ratio.max():.2f}]")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### overlap (traced steps of each apapo run, partition.json)", "",
              "| label | seed | plan (layers x ranks per stage) | compute s | comm s | exposed s | hidden share |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    exposed: dict[tuple[str, int], float] = {}
    for _, row in table[table["method"] == "apapo"].iterrows():
        record = json.loads((suite_dir / row["run_id"] / "partition.json").read_text())
        overlap, stages = record.get("overlap", {}), record["graph_plan"]["stages"]
        plan = " | ".join(f"{len(s['nodes'])}x{tuple(s['ranks'])}" for s in stages).replace("|", "/")
        compute = sum(s["compute_s"] for s in overlap.get("stages", []))
        share = overlap.get("hidden_share")
        exposed[(row["label"], row["seed"])] = overlap.get("exposed_s", float("nan"))
        lines.append(f"| {row['label']} | {row['seed']} | {plan} | {compute:.3f} | {overlap.get('comm_s', 0):.3f} | "
                     f"{overlap.get('exposed_s', 0):.3f} | {'' if share is None else f'{share:.2f}'} |")
    lines.append("")
    for (label, seed), value in sorted(exposed.items()):
        if "no-overlap" in label:
            on = exposed.get((label.replace(" no-overlap", ""), seed))
            if on is not None and value > 0:
                lines.append(f"- {label.replace(' no-overlap', '')}, seed {seed}: exposed communication with "
                             f"overlap {on:.3f} s, without {value:.3f} s: {1 - on / value:.0%} of it hidden")
    return "\n".join(lines)


def delayed_sgd(batch: int, lr: float, momentum: float, delay: int, epochs: int, seed: int = 0,
                flush_every: int | None = None, fresh_tail: bool = False) -> float:
    """Test accuracy of digits-resnet after `epochs` of W(t+1) = W(t) - SGD(grad f(W(t - delay))): what apapo computes
    with uniform delays D = delay (tests/apapo/test_apapo.py checks the two agree bitwise), on one process, one thread.
    `flush_every` F: iterations t with t % F == 0 use the current weights (a flush every F iterations); `fresh_tail`:
    the second half of the parameters (in model order) always uses the current weights, the pattern of per_stage
    delays on two stages."""
    import torch
    from torch.func import functional_call

    from harness import registry
    from harness.data.tensors import DataOrder

    torch.set_num_threads(1)
    workload = registry.WORKLOADS.get("digits-resnet").instantiate({})
    torch.manual_seed(seed)
    model = workload.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    order = DataOrder(len(workload.train), batch, seed)
    names = [name for name, _ in model.named_parameters()]
    fresh = set(names[len(names) // 2:]) if fresh_tail else set()
    versions = {0: {k: v.detach().clone() for k, v in model.named_parameters()}}
    for t in range(order.steps_per_epoch * epochs):
        d = 0 if flush_every and t % flush_every == 0 else delay
        old, new = versions[max(0, t - d)], versions[t]
        used = {k: (new[k] if k in fresh else old[k]).clone().requires_grad_(True) for k in old}
        ids = order.batch(t)
        outputs = functional_call(model, used, (workload.train.inputs(ids),))
        workload.loss(outputs, workload.train.targets(ids)).backward()
        for name, p in model.named_parameters():
            p.grad = used[name].grad
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        versions[t + 1] = {k: v.detach().clone() for k, v in model.named_parameters()}
        versions.pop(t - delay, None)
    with torch.no_grad():
        logits = model(workload.test.inputs(torch.arange(len(workload.test))))
    return float((logits.argmax(1) == workload.test.targets(torch.arange(len(workload.test)))).float().mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run", help="run suites/apapo.toml seed by seed, then the report")
    runner.add_argument("--out", default="results")
    runner.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    summary = sub.add_parser("summarize", help="markdown tables from a reported suite folder")
    summary.add_argument("suite_dir", type=Path)
    delay = sub.add_parser("delay", help="accuracy of SGD with a delayed gradient (2BW's update) on digits-resnet")
    delay.add_argument("--epochs", type=int, default=6)
    handling = sub.add_parser("handling", help="the delay handlings simulated on one process (docs/methods.md, "
                              "'Delay handling'): none, a flush every 2 iterations, the last half fresh")
    handling.add_argument("--epochs", type=int, default=10)
    handling.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.seeds)
    elif args.command == "delay":
        print("| batch | lr | momentum | delay | test accuracy |\n| --- | --- | --- | --- | --- |")
        for batch, lr, momentum in [(128, 0.1, 0.9), (128, 0.02, 0.9), (128, 0.1, 0.5), (128, 0.1, 0.0)]:
            for d in (0, 1):
                accuracy = delayed_sgd(batch, lr, momentum, d, args.epochs)
                print(f"| {batch} | {lr} | {momentum} | {d} | {accuracy:.3f} |", flush=True)
    elif args.command == "handling":
        print("| handling (batch 128, lr 0.1, m 0.9, delay 1) | test accuracy per seed |\n| --- | --- |")
        for name, kwargs in [("none (2BW)", {}), ("flush every 2", {"flush_every": 2}),
                             ("last half fresh (per_stage)", {"fresh_tail": True})]:
            accuracies = [delayed_sgd(128, 0.1, 0.9, 1, args.epochs, seed, **kwargs) for seed in args.seeds]
            print(f"| {name} | {', '.join(f'{a:.3f}' for a in accuracies)} |", flush=True)
    else:
        print(summarize(args.suite_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
