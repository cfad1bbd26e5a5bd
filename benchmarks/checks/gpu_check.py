"""The GPU path, checked where CUDA is present: every run of the smoke suite on nccl with CUDA tensors, then the
checks the CPU tests make (every run completed, on the GPU, accuracy (the GPT's: its held-out loss 1 nat below the
first evaluation's), data-parallel ranks bitwise equal).

    python benchmarks/checks/gpu_check.py [--out DIR] [--epochs 2] [--min-accuracy 0.8] [--cpu]

Without CUDA it says so in one line and exits 0. nccl puts one rank on each GPU, so a run with more ranks than
there are GPUs is listed as skipped, with the count it needs. `--cpu` runs the same suite and checks on gloo and the
CPU (how the checker itself is tested here). Exit 0 when every check passed, 1 otherwise. About 3 minutes on one
GPU (the smoke suite at 2 epochs, one seed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "suites" / "smoke.toml"
#: How far a language model's held-out loss must fall below its first evaluation's (nats per token).
MIN_LOSS_DROP = 1.0
#: Families whose ranks hold the same whole model after every step (data parallel): their parameters must agree.
REPLICATED = {"ddp", "fp16", "qsgd", "terngrad", "dgc", "onebit"}


def suite_text(smoke: Path, epochs: float, max_ranks: int | None) -> tuple[str, list[str]]:
    """The check's suite (the smoke suite's runs, its groups' too, one seed, `epochs` epochs, a checkpoint at the
    end) and the skipped runs ('method (N ranks)'). Runs needing more than `max_ranks` ranks are skipped (None: none
    are), and a [[group]] left without runs with them. The smoke suite's layout is read: its [[run]]s, then its
    [[group]]s, each with its [[group.run]]s."""
    text = smoke.read_text()
    runs_text, *group_texts = re.split(r"^\[\[group\]\]\s*$", text, flags=re.M)
    head, *blocks = re.split(r"^\[\[run\]\]\s*$", runs_text, flags=re.M)
    top = tomllib.loads(head)
    skipped: list[str] = []
    kept = [kept_block for block in blocks for kept_block in _kept("[[run]]", block, max_ranks, skipped)]
    for group_text in group_texts:
        group_head, *run_blocks = re.split(r"^\[\[group\.run\]\]\s*$", group_text, flags=re.M)
        runs = [kept_block for block in run_blocks
                for kept_block in _kept("[[group.run]]", block, max_ranks, skipped)]
        if runs:  # without its baseline: the check compares nothing, and the baseline's run may be skipped
            group_head = re.sub(r"^baseline\s*=.*$", "", group_head, flags=re.M)
            kept += ["[[group]]" + _check_budget(group_head, tomllib.loads(group_head)), *runs]
    defaults = "\n".join(f"{k} = {json.dumps(v)}" for k, v in top.get("defaults", {}).items())
    target = top.get("budget", {}).get("target_accuracy")
    header = (f'name = "gpu-check"\nworkload = {json.dumps(top["workload"])}\nseeds = [0]\n'
              f"checkpoint_every_steps = 1000000\n\n[budget]\nmax_epochs = {epochs}\n"
              f"eval_every_epochs = {epochs / 2}\n" + (f"target_accuracy = {target}\n" if target else "")
              + f"\n[defaults]\n{defaults}\n\n")
    return header + "".join(kept), skipped


def _kept(table: str, block: str, max_ranks: int | None, skipped: list[str]) -> list[str]:
    """One run's block under its `table` header ([[run]] or [[group.run]]) as the check keeps it, or none (the run
    named in `skipped`) when it needs more than `max_ranks` ranks."""
    run = tomllib.loads(block)
    ranks = int(run.get("world_size", 1))
    if max_ranks is not None and ranks > max_ranks:
        skipped.append(f"{run['method']} ({ranks} ranks)")
        return []
    return [table + _check_budget(block, run)]


def _check_budget(block: str, table: dict) -> str:
    """A run's or a group's block without its own epoch budget, which is longer than the check's: the check's
    replaces it. One in steps (the language model's: an epoch of its windows is long) is that run's own length, and
    is kept."""
    if "budget" in table and "max_steps" not in table["budget"]:
        block = re.sub(r"^budget\s*=.*$", "", block, flags=re.M)
    return block


def check_run(run_dir: Path, min_accuracy: float, want_cuda: bool) -> list[str]:
    """What is wrong with one finished run folder (empty: nothing)."""
    import torch

    problems = []
    spec = json.loads((run_dir / "spec.json").read_text())
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").exists() else {}
    if status.get("state") != "completed":
        return [f"state {status.get('state')}: {(status.get('error') or {}).get('message')}"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    if want_cuda and not manifest.get("gpu_model"):
        problems.append("manifest names no GPU: the run did not see CUDA")
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"kind": "eval"' in line or '"kind":"eval"' in line]
    if (spec.get("budget") or {}).get("target_loss") is not None:  # a language model: it must learn
        first, last = (evals[0]["test_loss"], evals[-1]["test_loss"]) if evals else (None, None)
        if last is None or not last <= first - MIN_LOSS_DROP:
            problems.append(f"held-out loss {last} is not {MIN_LOSS_DROP} nat below its first evaluation's {first}")
    else:
        accuracy = evals[-1]["test_accuracy"] if evals else None
        if accuracy is None or accuracy < min_accuracy:
            problems.append(f"final accuracy {accuracy} < {min_accuracy}")
    if spec["method"] in REPLICATED and spec["world_size"] > 1:
        saved = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
        models = [rank["method"]["model"] for rank in saved["ranks"]]
        for r, model in enumerate(models[1:], 1):
            differ = [k for k in models[0] if not torch.equal(models[0][k], model[k])]
            if differ:
                problems.append(f"rank {r}'s parameters differ from rank 0's (first: {differ[0]})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="results folder (default: a temporary one)")
    parser.add_argument("--epochs", type=float, default=2.0, help="epochs per run (default 2)")
    parser.add_argument("--min-accuracy", type=float, default=0.8, help="final test accuracy every run must reach")
    parser.add_argument("--cpu", action="store_true", help="run the check on gloo and the CPU")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu:
        print("gpu check: no CUDA device here (torch.cuda.is_available() is False); nothing to check")
        return 0
    gpus = torch.cuda.device_count() if cuda and not args.cpu else None
    out = args.out or Path(tempfile.mkdtemp(prefix="dtbench-gpu-"))
    text, skipped = suite_text(SMOKE, args.epochs, gpus)
    suite = out / "gpu-check.toml"
    out.mkdir(parents=True, exist_ok=True)
    suite.write_text(text)
    env = dict(os.environ)
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    where = f"{gpus} GPU(s), {torch.cuda.get_device_name(0)}" if gpus else "CPU (gloo)"
    print(f"gpu check on {where}: {suite} -> {out}" + (f"; skipped (one rank per GPU): {', '.join(skipped)}"
                                                       if skipped else ""), flush=True)
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(out), "--quiet"],
                          env=env, cwd=ROOT)
    failures = 0
    for run_dir in sorted((out / "gpu-check").glob("*/spec.json")):
        problems = check_run(run_dir.parent, args.min_accuracy, want_cuda=not args.cpu)
        failures += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '}  {run_dir.parent.name}" + (f": {'; '.join(problems)}"
                                                                              if problems else ""))
    ok = failures == 0 and done.returncode == 0
    print(f"gpu check: {'passed' if ok else 'FAILED'} ({failures} runs with problems, dtbench run exit "
          f"{done.returncode})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
