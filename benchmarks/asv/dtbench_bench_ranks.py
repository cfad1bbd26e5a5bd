"""Rank-side code of the runner benchmarks: a runner Loop as the worker builds it, and the ddp-vs-torch timing.

Spawned ranks import this module by its top-level name (benchmarks/asv is on sys.path, see __init__), since asv's
own name for this package, `asv`, would resolve to the asv tool in a fresh process.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKLOAD = "synthetic-mlp"  # default sizes: 256 -> 4 x 512 -> 10 (about 0.9M parameters), 8192 train samples
PARAMS = {"batch_size": 128, "lr": 0.05, "momentum": 0.9}


def interleaved(variants: dict[str, Callable[[], object]], rounds: int, steps: int, warmup: int,
                barrier_after: bool = False) -> dict[str, list[float]]:
    """Seconds per call of each variant, in alternating blocks of `steps` calls (order reversed every other round,
    so machine noise hits all alike), after `warmup` calls of each. Every block starts with a barrier of the ranks;
    with `barrier_after` it also ends with one, so a block times the whole group's work, not just this rank's."""
    import torch.distributed as dist

    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    for r in range(rounds):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
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

        times = interleaved({"ddp": loop.train_one_step, "torch": torch_step}, rounds, steps, warmup=steps)
        loop.writer.close()
    return times


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
