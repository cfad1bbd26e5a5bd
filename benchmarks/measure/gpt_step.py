"""The harness's GPT training step (the runner's Loop driving sgd) against a plain PyTorch loop, interleaved in one run.

shakespeare-gpt at nanoGPT's CPU configuration (n_layer 4, n_head 4, d_model 128, context 64, batch 12; AdamW lr
1e-3, betas 0.9/0.99, weight_decay 0.1; grad_clip 1.0), one process, `--threads` threads (1 by default). Three
variants run in the same process from the same initial weights (seed 0) on the same batches (DataOrder, seed 0):

- harness: `Loop.train_one_step`, the runner's whole step as harness/run/worker.py builds it: the Batch, the lr
  schedule (the workload's cosine with warm-up), the sgd method's train_step (forward, sequence_cross_entropy,
  backward, harness.toolkit.clip_gradients, AdamW with foreach=False, loss.item()), the train record written to
  metrics.jsonl. With one rank there is no control round (the Loop agrees with itself).
- method: `sgd.train_step(Batch(...))` alone, without the Loop: where the overhead is, if there is one.
- plain: the textbook loop: x, y = the batch's windows; logits = model(x); F.cross_entropy; zero_grad; backward;
  clip_grad_norm_; AdamW(foreach=False).step(); loss.item().

The variants alternate in blocks of `--steps` steps (order reversed every other round) after `--steps` warm-up steps
each, so machine noise hits all alike. As the worker does, the process runs under the suite defaults
`deterministic = true` and `allocator = "retain"`; both are global, so every variant runs under them.

    DTBENCH_CACHE_DIR=/tmp/dtcache python benchmarks/measure/gpt_step.py [--steps 20] [--blocks 15] [--threads 1]
        [--corpus DIR] [--json OUT]

`--corpus DIR` trains on a folder of text files instead of the pinned Shakespeare (the workload's `corpus` option;
the tests' run of this script uses one, to need no download).

Prints the median step time of each, the ratio harness / plain (median of per-round ratios, a bootstrap 95%
interval of that median, and the ratio of the fastest blocks) and a verdict against the goal ratio <= 1.03.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

WORKLOAD = "shakespeare-gpt"
OPTIONS = {"n_layer": 4, "n_head": 4, "d_model": 128, "context": 64}
#: nanoGPT's shakespeare_char CPU run; also the workload's own hyperparameters (harness/workloads/lm.py).
PARAMS = {"batch_size": 12, "lr": 1e-3, "optimizer": "adamw", "betas": [0.9, 0.99], "weight_decay": 0.1,
          "grad_clip": 1.0}
GOAL = 1.03


def summarize(ours: list[float], base: list[float], goal: float, name: str, resamples: int = 2000) -> dict[str, Any]:
    """Ratio ours / base of per-block step times measured in the same rounds: the median of per-round ratios, a
    bootstrap 95% interval of that median (rounds resampled, seed 0), the ratio of the fastest blocks, and a
    verdict against `goal` (met: the interval's top is within it; not met: its bottom is above it)."""
    ratios = [a / b for a, b in zip(ours, base, strict=True)]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    low, high = boot[int(0.025 * resamples)], boot[min(resamples - 1, int(0.975 * resamples))]
    median = statistics.median(ratios)
    if high <= goal:
        verdict = f"met: {name} {median:.3f}, 95% interval [{low:.3f}, {high:.3f}] within the goal <= {goal:.2f}"
    elif low > goal:
        verdict = f"NOT met: {name} {median:.3f}, 95% interval [{low:.3f}, {high:.3f}] above the goal <= {goal:.2f}"
    else:
        verdict = (f"within the noise: {name} {median:.3f}, 95% interval [{low:.3f}, {high:.3f}] straddles the goal "
                   f"<= {goal:.2f} (more --blocks, or a quieter machine)")
    return {"ratio": median, "interval": [low, high], "ratio_of_fastest": min(ours) / min(base),
            "per_round": ratios, "goal": goal, "met": high <= goal, "verdict": verdict}


def alternate(variants: dict[str, Callable[[], object]], blocks: int, steps: int, warmup: int
              ) -> dict[str, list[float]]:
    """Seconds per call of each variant, per block of `steps` calls, in alternating blocks (order reversed every other
    round) after `warmup` calls of each (one process: no barrier)."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(blocks):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
            fn = variants[name]
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            times[name].append((time.perf_counter() - start) / steps)
    return times


def make_loop(folder: Path, threads: int, deterministic: bool, options: dict[str, Any]) -> Any:
    """The sgd method on shakespeare-gpt (workload `options`) and its runner Loop as harness/run/worker.py builds
    them (one rank, the workload's hyperparameters with PARAMS, a train record per step into folder/metrics.jsonl)."""
    import torch

    from _dist import context
    from harness.budget import Budget
    from harness.run.clock import TrainClock
    from harness.run.loop import Loop
    from harness.run.records import MetricsWriter
    from harness.suite.spec import RunSpec

    cls, ctx = context("sgd", 0, 1, PARAMS, workload=WORKLOAD, run_dir=folder, options=options)
    torch.manual_seed(0)
    method = cls(ctx)
    spec = RunSpec(suite="bench", run_id="bench", label="sgd", method="sgd", family=cls.family, workload=WORKLOAD,
                   workload_options=options, world_size=1, seed=0, params=ctx.params.model_dump(),
                   budget=Budget(max_steps=10**9), threads_per_rank=threads, deterministic=deterministic,
                   log_every_steps=1)
    clock = TrainClock()
    clock.start_training()
    return Loop(spec, method, ctx.workload.train, ctx.workload.test, ctx.comm,
                MetricsWriter(folder / "metrics.jsonl", 0, clock), clock)


def bench(steps: int, blocks: int, threads: int, deterministic: bool, options: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.nn import functional as F

    from harness.data.tensors import Batch, DataOrder
    from harness.run.allocator import configure

    torch.set_num_threads(threads)
    configure("retain")  # the suites' default allocator, as the worker applies it
    if deterministic:
        torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as folder:
        loop = make_loop(Path(folder), threads, deterministic, options)
        method, train = loop.method, loop.train
        params = method.ctx.params
        assert (params.batch_size, params.lr, tuple(params.betas), params.weight_decay, params.grad_clip,
                params.eps) == (12, 1e-3, (0.9, 0.99), 0.1, 1.0, 1e-8), params
        torch.manual_seed(0)
        model = method.ctx.workload.make_model()
        same_init = all(torch.equal(a, b) for a, b in zip(model.parameters(), method.model.parameters(), strict=True))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, foreach=False)
        order = DataOrder(len(train), PARAMS["batch_size"], seed=0)
        counters = {"plain": 0, "method": 0}

        def plain() -> float:
            idx = order.batch(counters["plain"])
            x, y = train.inputs(idx), train.targets(idx)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            counters["plain"] += 1
            return loss.item()

        # A second sgd, stepped without the Loop, from the same initial weights (seed 0, as context() seeded the first)
        cls, ctx = type(method), method.ctx
        torch.manual_seed(0)
        bare = cls(ctx)

        def method_only() -> float:
            t = counters["method"]
            counters["method"] += 1
            return bare.train_step(Batch(t, order.epoch_of(t), order.batch(t), train, 0)).loss

        first_plain = plain()
        first_method = method_only()
        loop.train_one_step()
        first_harness = _last_train_loss(Path(folder) / "metrics.jsonl")
        load_before = os.getloadavg()
        times = alternate({"harness": loop.train_one_step, "method": method_only, "plain": plain}, blocks, steps,
                          warmup=steps)
        load_after = os.getloadavg()
        loop.writer.close()
    return {"times": times, "same_init": same_init, "first_loss": {"harness": first_harness, "method": first_method,
                                                                   "plain": first_plain},
            "load_average": [load_before, load_after]}


def _last_train_loss(path: Path) -> float:
    """The loss of the last train record in a metrics.jsonl."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in lines if r["kind"] == "train"][-1]["loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per block (and warm-up steps of each variant)")
    parser.add_argument("--blocks", type=int, default=15, help="rounds of one block of each variant")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (torch.set_num_threads)")
    parser.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                        help="do not call torch.use_deterministic_algorithms(True) (the suites' default is on)")
    parser.add_argument("--corpus", type=Path, metavar="DIR",
                        help="a folder of text files to train on instead of the pinned Shakespeare")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    a = parser.parse_args()
    options = {**OPTIONS, **({"corpus": str(a.corpus.resolve())} if a.corpus else {})}
    out = bench(a.steps, a.blocks, a.threads, a.deterministic, options)
    times = out["times"]
    med = {name: statistics.median(values) for name, values in times.items()}
    harness = summarize(times["harness"], times["plain"], GOAL, "harness/plain")
    method = summarize(times["method"], times["plain"], GOAL, "method/plain")
    loss = out["first_loss"]
    print(f"{WORKLOAD} {options}, batch {PARAMS['batch_size']}, AdamW, grad_clip 1.0; 1 process x {a.threads} "
          f"thread(s), deterministic {a.deterministic}; {a.blocks} blocks x {a.steps} steps of each, interleaved "
          f"(load average {out['load_average'][0][0]:.2f} -> {out['load_average'][1][0]:.2f})")
    print(f"same initial weights: {out['same_init']}; first-step loss: harness {loss['harness']:.6f}, method "
          f"{loss['method']:.6f}, plain {loss['plain']:.6f}")
    print(f"plain PyTorch loop : {med['plain'] * 1e3:8.3f} ms/step (median of blocks)")
    print(f"harness Loop step  : {med['harness'] * 1e3:8.3f} ms/step (median of blocks), the runner's whole step")
    print(f"  method alone     : {med['method'] * 1e3:8.3f} ms/step (median of blocks), sgd.train_step, no Loop")
    for name, s in (("harness/plain", harness), ("method/plain", method)):
        print(f"ratio {name}: {s['ratio']:.3f} (median of per-round ratios; 95% interval [{s['interval'][0]:.3f}, "
              f"{s['interval'][1]:.3f}]; fastest blocks {s['ratio_of_fastest']:.3f})")
    print(f"verdict (goal harness/plain <= {GOAL:.2f}): {harness['verdict']}")
    if a.json:
        a.json.write_text(json.dumps({"config": {"workload": WORKLOAD, "options": options, "params": PARAMS,
                                                 "threads": a.threads, "deterministic": a.deterministic,
                                                 "steps": a.steps, "blocks": a.blocks},
                                      "median_s": med, "harness_vs_plain": harness, "method_vs_plain": method,
                                      **{k: v for k, v in out.items() if k != "times"}, "block_s": times},
                                     indent=2))


if __name__ == "__main__":
    main()
