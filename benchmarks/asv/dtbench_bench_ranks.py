"""Rank-side code of the runner benchmarks: a runner Loop as the worker builds it, and the ddp-vs-torch timing.

Spawned ranks import this module by its top-level name (benchmarks/asv is on sys.path, see __init__), since asv's
own name for this package, `asv`, would resolve to the asv tool in a fresh process.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

WORKLOAD = "synthetic-mlp"  # default sizes: 256 -> 4 x 512 -> 10 (about 0.9M parameters), 8192 train samples
PARAMS = {"batch_size": 128, "lr": 0.05, "momentum": 0.9}


def make_loop(method_name: str, rank: int, world_size: int, folder: Path, workload: str = WORKLOAD,
              params: dict | None = None, options: dict | None = None) -> Any:
    """A runner Loop of `method_name` (default: on synthetic-mlp with PARAMS), one train record per step into
    folder/metrics<rank>.jsonl.

    The process group must exist when world_size > 1. Nothing is evaluated: callers drive `train_one_step`.
    """
    import torch

    from _dist import context
    from harness import workloads
    from harness.config import Budget, RunSpec
    from harness.recorder import MetricsWriter, TrainClock
    from harness.runner import Loop

    cls, ctx = context(method_name, rank, world_size, params or PARAMS, workload=workload, run_dir=folder)
    if options:
        ctx.workload = workloads.get(workload).instantiate(options)
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
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from harness.data import DataOrder

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

        variants = {"ddp": loop.train_one_step, "torch": torch_step}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for step in variants.values():
            for _ in range(steps):
                step()
        for index in range(rounds):
            for name in (list(variants) if index % 2 == 0 else list(reversed(variants))):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(steps):
                    variants[name]()
                times[name].append((time.perf_counter() - start) / steps)
        loop.writer.close()
    return times
