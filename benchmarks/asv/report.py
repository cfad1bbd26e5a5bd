"""Report generation (`harness.report.build.write_report`) for a results folder of 20 runs, generated in setup_cache."""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
from pathlib import Path

from harness.report.build import write_report  # at import: asv's forkserver then imports pandas and seaborn once

METHODS = [("sgd", 1, 0), ("ddp", 2, 104_488), ("qsgd", 2, 14_000), ("terngrad", 2, 6_600), ("dgc", 2, 900)]
SEEDS = [0, 1, 2, 3]  # 5 methods x 4 seeds = 20 runs
STEPS = 440  # 10 epochs of the digits workload at batch 32, one train record per step and rank
EVAL_EVERY = 22  # half an epoch
TARGET = 0.95


def write_run(suite_dir: Path, method: str, world_size: int, bytes_per_step: int, seed: int) -> None:
    """One completed run folder as the runner writes it: spec, status, manifest and metrics.jsonl.

    Train records come from every rank at every step, with cumulative bytes; rank 0 evaluates every EVAL_EVERY
    steps. Accuracy climbs towards about 0.97 with seeded noise; the clock advances about 4 ms per step.
    """
    run_id = f"{method}-digits-mlp-w{world_size}-s{seed}"
    run_dir = suite_dir / run_id
    run_dir.mkdir(parents=True)
    budget = {"max_epochs": 10.0, "max_steps": None, "max_train_seconds": None, "eval_every_epochs": 0.5,
              "eval_every_seconds": None, "target_accuracy": TARGET}
    spec = {"suite": "bench", "run_id": run_id, "label": f"{method} x{world_size}", "method": method,
            "family": "reference" if method == "sgd" else "data-parallel", "workload": "digits-mlp",
            "workload_options": {}, "world_size": world_size, "seed": seed,
            "params": {"batch_size": 32, "lr": 0.05, "momentum": 0.9}, "budget": budget, "threads_per_rank": 1,
            "deterministic": True, "log_every_steps": 1, "data_root": None, "suite_file": "suites/bench.toml"}
    rng = random.Random(f"{method}-{seed}")
    step_s = 0.004 * (1 + 0.2 * rng.random())
    records = []
    for step in range(STEPS + 1):
        if step % EVAL_EVERY == 0:
            accuracy = min(0.99, 0.97 * (1 - math.exp(-step / 60)) + 0.1 * math.exp(-step / 60)
                           + rng.gauss(0, 0.01))
            records.append({"kind": "eval", "rank": 0, "wall_time_s": 0.5 + step * step_s * 1.1,
                            "train_time_s": step * step_s, "step": step, "epoch": step / 44, "samples": 32 * step,
                            "test_accuracy": accuracy, "test_loss": 2.3 * (1 - accuracy)})
        if step == 0:
            continue
        for rank in range(world_size):
            sent = bytes_per_step * step
            records.append({"kind": "train", "rank": rank, "wall_time_s": 0.5 + step * step_s * 1.1 + 0.001 * rank,
                            "train_time_s": step * step_s + 0.001 * rank, "step": step, "epoch": step / 44,
                            "samples": 32 * step, "loss": 2.3 * math.exp(-step / 80) + rng.random() * 0.01,
                            "bytes_sent": sent, "bytes_recv": sent,
                            "bytes_by_category": {"gradients": [sent, sent]} if sent else {}})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2))
    final = {"steps": STEPS, "epoch": STEPS / 44, "samples": 32 * STEPS, "train_time_s": STEPS * step_s}
    (run_dir / "status.json").write_text(json.dumps({"state": "completed", "error": None, "final": final,
                                                      "updated": "2026-11-29T10:00:00Z"}, indent=2))
    (run_dir / "manifest.json").write_text(json.dumps({"hostname": "bench", "launcher": "local", "seed": seed,
                                                        "git": {"commit": "0" * 40, "dirty": False}}, indent=2))


def write_suite(suite_dir: Path) -> Path:
    """The 20-run folder: METHODS x SEEDS."""
    for method, world_size, bytes_per_step in METHODS:
        for seed in SEEDS:
            write_run(suite_dir, method, world_size, bytes_per_step, seed)
    return suite_dir


_warm = False


class WriteReport:
    """summary.csv, four PNG plots and index.html for 20 runs (about 15k metrics records)."""

    number = 1
    repeat = (3, 6, 15.0)
    warmup_time = 0.0
    timeout = 300

    def setup_cache(self) -> str:
        # asv keeps the working directory of setup_cache for the benchmarks that share it.
        return str(write_suite(Path("suite").resolve()))

    def setup(self, suite_dir: str) -> None:
        global _warm
        self.out = Path(tempfile.mkdtemp(prefix="dtbench-bench-report-"))
        if not _warm:  # once per process: font cache and first-use costs of matplotlib and seaborn
            write_report(suite_dir, self.out)
            _warm = True

    def teardown(self, suite_dir: str) -> None:
        shutil.rmtree(self.out, ignore_errors=True)

    def time_write_report(self, suite_dir: str) -> None:
        write_report(suite_dir, self.out)

    def peakmem_write_report(self, suite_dir: str) -> None:
        write_report(suite_dir, self.out)
