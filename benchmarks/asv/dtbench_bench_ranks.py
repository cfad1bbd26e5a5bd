"""Rank-side code of the runner benchmarks: a runner Loop as the worker builds it, and the ddp-vs-torch timing.

Spawned ranks import this module by its top-level name (benchmarks/asv is on sys.path, see __init__), since asv's
own name for this package, `asv`, would resolve to the asv tool in a fresh process.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKLOAD = "synthetic-mlp"  # default sizes: 256 -> 4 x 512 -> 10 (about 0.9M parameters), 8192 train samples
PARAMS = {"batch_size": 128, "lr": 0.05, "momentum": 0.9}


def interleaved(variants: dict[str, Callable[[], object]], rounds: int, steps: int, warmup: int,
                barrier_after: bool = False, clocks: dict[str, Any] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each variant, in alternating blocks of `steps` calls (order reversed every other round,
    so machine noise hits all alike), after `warmup` calls of each. Every block starts with a barrier of the ranks;
    with `barrier_after` it also ends with one, so a block times the whole group's work, not just this rank's.

    `clocks`: {variant: the TrainClock of the Loop it steps}, stopped while the other variants run (warm-up
    included). A Loop paces its control rounds by its train time (harness/run/loop.py: one round about every 0.05 s,
    at most every 8 steps), so its clock must count its own steps only, as in a run; otherwise the other variants'
    time makes its steps look slower and its rounds come more often than a run's."""
    import torch.distributed as dist

    def paused(name: str) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for other, clock in (clocks or {}).items():
            if other != name:
                stack.enter_context(clock.excluded())
        return stack

    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, fn in variants.items():
        with paused(name):
            for _ in range(warmup):
                fn()
    for r in range(rounds):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
            with paused(name):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(steps):
                    variants[name]()
                if barrier_after:
                    dist.barrier()
                times[name].append((time.perf_counter() - start) / steps)
    return times


def make_loop(method_name: str, rank: int, world_size: int, folder: Path, workload: str = WORKLOAD,
              params: dict | None = None, options: dict | None = None) -> Any:
    """A runner Loop of `method_name` (default: on synthetic-mlp with PARAMS), one train record per step into
    folder/metrics<rank>.jsonl.

    The process group must exist when world_size > 1. Nothing is evaluated: callers drive `train_one_step`.
    """
    import torch

    from _dist import context
    from harness import registry
    from harness.budget import Budget
    from harness.run.clock import TrainClock
    from harness.run.loop import Loop
    from harness.run.records import MetricsWriter
    from harness.suite.spec import RunSpec

    cls, ctx = context(method_name, rank, world_size, params or PARAMS, workload=workload, run_dir=folder)
    if options:
        ctx.workload = registry.WORKLOADS.get(workload).instantiate(options)
        torch.manual_seed(0)
    method = cls(ctx)
    spec = RunSpec(suite="bench", run_id="bench", label=method_name, method=method_name, family=cls.family,
                   workload=workload, workload_options=options or {}, world_size=world_size, seed=0,
                   params=ctx.params.model_dump(), budget=Budget(max_steps=10**9), threads_per_rank=1,
                   deterministic=False, log_every_steps=1)
    clock = TrainClock()
    clock.start_training()
    writer = MetricsWriter(folder / f"metrics{rank}.jsonl", rank, clock)
    return Loop(spec, method, ctx.workload.train, ctx.workload.test, ctx.comm, writer, clock)


def ddp_against_torch(rank: int, world_size: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """Per-step seconds of dtbench's ddp (the runner's whole step) and of a hand-written torch DDP loop.

    Both run in these processes on the same model, data shards and optimizer settings, in alternating blocks of
    `steps` steps after `steps` warm-up steps each. Returns {"ddp": [...], "torch": [...]}, one value per round.
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from harness.data.tensors import DataOrder

    with tempfile.TemporaryDirectory() as folder:
        loop = make_loop("ddp", rank, world_size, Path(folder))
        workload = loop.method.ctx.workload
        torch.manual_seed(0)
        model = DistributedDataParallel(workload.make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=PARAMS["lr"], momentum=PARAMS["momentum"])
        order = DataOrder(len(workload.train), PARAMS["batch_size"], seed=0)
        per_rank = PARAMS["batch_size"] // world_size
        torch_steps = 0

        def torch_step() -> None:
            nonlocal torch_steps
            index = order.batch(torch_steps)[rank * per_rank:(rank + 1) * per_rank]
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(workload.train.inputs(index)),
                                              workload.train.targets(index)).backward()
            optimizer.step()
            torch_steps += 1

        times = interleaved({"ddp": loop.train_one_step, "torch": torch_step}, rounds, steps, warmup=steps,
                            clocks={"ddp": loop.clock})
        loop.writer.close()
    return times


#: The runner-cost benchmark's run: digits-mlp (a step of about 3 ms on 2 ranks), as in the smoke suite.
COST_WORKLOAD = "digits-mlp"
COST_PARAMS = {"batch_size": 32, "lr": 0.01, "momentum": 0.9}


def runner_against_method(rank: int, world_size: int, rounds: int, steps: int, workload: str = COST_WORKLOAD,
                          params: dict | None = None, cpu_steps: int = 0) -> dict[str, list[float]]:
    """Per-step seconds of the runner's whole step (`Loop.train_one_step` of ddp: the batch, the method's step, the
    train record, the ranks' agreement) and of the method's step alone (`train_step` of the same ddp on the same
    batches, no Loop), in alternating blocks of `steps` after `steps` warm-up steps each.

    Returns {"whole": [...], "method": [...]}, one value per round (their difference is what the runner adds), and
    "runner_cpu": for `cpu_steps` more whole steps, each step's CPU seconds of this thread in `train_one_step`
    outside the method's `train_step` (the runner's own work, free of other processes' time; measured after the
    timed rounds, so that its clock calls are not in them).
    """
    from harness.data.tensors import Batch

    with tempfile.TemporaryDirectory() as folder:
        loop = make_loop("ddp", rank, world_size, Path(folder), workload, params or COST_PARAMS)
        method, order, train = loop.method, loop.order, loop.train
        method_steps = 0

        def method_step() -> None:
            nonlocal method_steps
            method.train_step(Batch(method_steps, order.epoch_of(method_steps), order.batch(method_steps), train, 0))
            method_steps += 1

        times = interleaved({"whole": loop.train_one_step, "method": method_step}, rounds, steps, warmup=steps,
                            clocks={"whole": loop.clock})
        times["runner_cpu"] = runner_cpu(loop, cpu_steps)
        loop.writer.close()
    return times


def runner_cpu(loop: Any, steps: int) -> list[float]:
    """Each of `steps` calls of loop.train_one_step: this thread's CPU seconds in it outside the method's
    train_step (time.thread_time around both)."""
    inner = loop.method.train_step
    in_method = 0.0

    def timed(batch: Any) -> Any:
        nonlocal in_method
        start = time.thread_time()
        try:
            return inner(batch)
        finally:
            in_method += time.thread_time() - start

    loop.method.train_step = timed
    out = []
    try:
        for _ in range(steps):
            in_method = 0.0
            start = time.thread_time()
            loop.train_one_step()
            out.append(time.thread_time() - start - in_method)
    finally:
        del loop.method.train_step  # the class's method again
    return out


def per_round_cost(ranks: list[dict[str, list[float]]], whole: str = "whole", method: str = "method") -> list[float]:
    """Each round's runner cost per step in seconds: the whole step (variant `whole`) minus the method's step
    (variant `method`), each the slower rank's (the ranks wait for each other at every collective, so the slower
    rank's time is the group's)."""
    slower = {name: [max(values) for values in zip(*(times[name] for times in ranks), strict=True)]
              for name in (whole, method)}
    return [w - m for w, m in zip(slower[whole], slower[method], strict=True)]


def single_process_baselines(steps: int, width: int = 2048, layers: int = 8, batch: int = 256,
                             microbatches: int = 8) -> dict[str, float]:
    """Median step times of the whole model in this process: one thread accumulating `microbatches` microbatches,
    and two threads on the whole batch."""
    import statistics

    import torch
    from torch import nn

    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g)
    y = torch.randint(0, width, (batch,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(parts: int) -> None:
        opt.zero_grad(set_to_none=True)
        for xs, ys in zip(torch.split(x, batch // parts), torch.split(y, batch // parts), strict=True):
            (nn.functional.cross_entropy(model(xs), ys) / parts).backward()
        opt.step()

    before = torch.get_num_threads()
    out = {}
    try:
        for name, threads, parts in (("one_thread_accumulated", 1, microbatches), ("two_threads_whole", 2, 1)):
            torch.set_num_threads(threads)
            step(parts)
            samples = []
            for _ in range(steps):
                start = time.perf_counter()
                step(parts)
                samples.append(time.perf_counter() - start)
            out[name] = statistics.median(samples)
    finally:
        torch.set_num_threads(before)
    return out
