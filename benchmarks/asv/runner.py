"""The runner's hot paths: one training step of sgd (in-process) and ddp (2 gloo processes) on synthetic-mlp, next
to a hand-written torch DDP loop; the runner's own cost per step on digits-mlp; and the fixed start-up cost of a
whole 1-step `dtbench run` and of a suite of ten."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch  # at import: asv's forkserver then imports it once for every benchmark process

from . import CODE_ROOT
from .startup_suite import write_suite

DDP_ROUNDS = 5  # alternating blocks of each variant
DDP_STEPS = 20  # steps per block (and warm-up steps per variant)
# RunnerCost: many short alternating blocks (a shared machine's noise comes in bursts that short blocks pair off);
# 8 steps a block, so that each block holds one control round (one every 8 steps at this step time); then
# COST_CPU_STEPS steps for the runner's CPU time
COST_ROUNDS = 200
COST_STEPS = 8
COST_CPU_STEPS = 800
SUITE_SEEDS = 5  # SuiteStartup's suite: sgd and ddp, each once per seed


class SGDStep:
    """`Loop.train_one_step` of sgd in this process, one thread: batch, forward/backward/update, train record."""

    timeout = 120

    def setup(self) -> None:
        from dtbench_bench_ranks import make_loop

        torch.set_num_threads(1)
        self.folder = Path(tempfile.mkdtemp(prefix="dtbench-bench-"))
        self.loop = make_loop("sgd", 0, 1, self.folder)
        for _ in range(5):
            self.loop.train_one_step()

    def teardown(self) -> None:
        self.loop.writer.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def time_sgd_step(self) -> None:
        self.loop.train_one_step()


class DDPStep:
    """dtbench's ddp step (the runner's whole step) and a hand-written torch DDP step, 2 gloo ranks x 1 thread.

    One spawn measures both in alternating blocks (setup_cache); per round the slower rank's time counts, and the
    tracked values are medians over rounds.
    """

    timeout = 300

    def setup_cache(self) -> dict[str, float]:
        from dtbench_bench_ranks import ddp_against_torch

        from _dist import spawn

        ranks = spawn(ddp_against_torch, 2, DDP_ROUNDS, DDP_STEPS, timeout=240)
        ddp = [max(values) for values in zip(*(times["ddp"] for times in ranks), strict=True)]
        plain = [max(values) for values in zip(*(times["torch"] for times in ranks), strict=True)]
        return {"ddp": statistics.median(ddp), "torch": statistics.median(plain),
                "ratio": statistics.median(a / b for a, b in zip(ddp, plain, strict=True))}

    def track_ddp_step(self, cache: dict[str, float]) -> float:
        return cache["ddp"]

    track_ddp_step.unit = "seconds"

    def track_torch_ddp_step(self, cache: dict[str, float]) -> float:
        return cache["torch"]

    track_torch_ddp_step.unit = "seconds"

    def track_ddp_vs_torch_ddp(self, cache: dict[str, float]) -> float:
        """dtbench ddp / hand-written torch DDP, per-round ratio's median; 1.0 means no overhead."""
        return cache["ratio"]

    track_ddp_vs_torch_ddp.unit = "x torch DDP"


class RunnerCost:
    """What the runner adds to a step: `Loop.train_one_step` of ddp minus the same ddp's `train_step` alone, on
    digits-mlp (batch 32, a step of about 3 ms) on 2 gloo ranks x 1 thread, in alternating blocks in the same two
    processes (setup_cache). The rest is the runner's: the train record, the ranks' agreement (a control round
    every 8 steps here), the hang watch's beat. Also the runner's CPU time per step, which other processes hardly
    move."""

    timeout = 300

    def setup_cache(self) -> dict[str, float]:
        from dtbench_bench_ranks import per_round_cost, runner_against_method

        from _dist import spawn

        ranks = spawn(runner_against_method, 2, COST_ROUNDS, COST_STEPS, "digits-mlp", None, COST_CPU_STEPS,
                      timeout=240)
        return {"cost_us": statistics.median(per_round_cost(ranks)) * 1e6,
                "cpu_us": max(statistics.mean(times["runner_cpu"]) for times in ranks) * 1e6}

    def track_runner_cost_per_step(self, cache: dict[str, float]) -> float:
        """The whole step minus the method's step, per step (median of per-round differences); goal <= 200 us."""
        return cache["cost_us"]

    track_runner_cost_per_step.unit = "us"

    def track_runner_cpu_per_step(self, cache: dict[str, float]) -> float:
        """The main thread's CPU time per step in Loop.train_one_step outside the method's train_step (the Batch,
        the record, the agreement; the mean over COST_CPU_STEPS steps, the busier rank's)."""
        return cache["cpu_us"]

    track_runner_cpu_per_step.unit = "us"


def run_suite_once(suite: Path, out: Path) -> None:
    """`dtbench run SUITE --quiet` in a fresh interpreter, measuring the code under test (CODE_ROOT)."""
    env = {**os.environ, "PYTHONPATH": str(CODE_ROOT), "MPLBACKEND": "Agg"}
    subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(out), "--quiet"],
                   check=True, env=env, cwd=suite.parent, stdout=subprocess.DEVNULL)


class RunStartup:
    """A whole `dtbench run` of a 1-step suite in a fresh interpreter: imports, launch, rendezvous, one step, one
    evaluation, the result files. Nearly all of it is the fixed cost every run pays (docs/benchmarks.md,
    "Start-up")."""

    params = ["sgd", "ddp"]
    param_names = ["method"]
    number = 1
    repeat = (2, 3, 20.0)
    rounds = 1
    warmup_time = 0.0
    timeout = 300

    def setup(self, method: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="dtbench-bench-"))
        self.suite = write_suite(self.folder, [method])
        self.runs = 0

    def teardown(self, method: str) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def time_dtbench_run_1_step(self, method: str) -> None:
        self.runs += 1
        run_suite_once(self.suite, self.folder / f"out{self.runs}")


class SuiteStartup:
    """A whole `dtbench run` of a suite of ten 1-step runs (sgd on 1 rank and ddp on 2, 5 seeds each): the first
    run pays the process start, the nine others what each further run of a suite costs."""

    number = 1
    repeat = (2, 3, 60.0)
    rounds = 1
    warmup_time = 0.0
    timeout = 600

    def setup(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="dtbench-bench-"))
        self.suite = write_suite(self.folder, ["sgd", "ddp"], seeds=SUITE_SEEDS)
        self.runs = 0

    def teardown(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def time_dtbench_run_10_runs(self) -> None:
        self.runs += 1
        run_suite_once(self.suite, self.folder / f"out{self.runs}")
