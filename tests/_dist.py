"""Test helper: run a function on W real gloo processes (one thread each, forked from the launcher's warm
forkserver, harness/launch/warm.py) and collect what each returns."""

from __future__ import annotations

import pickle
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _wrap(fn: Callable[..., Any], rank: int, world_size: int, port: int, out: Any, args: tuple,
          allocator: str = "retain") -> None:
    import torch
    import torch.distributed as dist

    from harness.run.allocator import configure

    torch.set_num_threads(1)
    try:
        configure(allocator)  # as the worker does (harness/run/worker.py); a bad policy reaches the test as an error
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        # plain pickle: torch's shared-memory tensor passing dies with the child process
        report = (rank, pickle.dumps(fn(rank, world_size, *args)), None)
    except BaseException:  # noqa: BLE001
        report = (rank, None, traceback.format_exc())
    # The report reaches the pipe before the process group is torn down: a C++ thread aborting the process in that
    # teardown ("terminate called ...: Resource deadlock avoided", seen once in a full run) must not lose it.
    out.put(report)
    out.close()
    out.join_thread()
    if dist.is_initialized():
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0,
          allocator: str = "retain") -> list[Any]:
    """fn(rank, world_size, *args) on every rank, under the ranks' malloc policy `allocator` (harness/run/allocator.py);
    returns the results ordered by rank; raises on any failure."""
    import torch.distributed as dist

    from harness.launch import warm

    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    ctx = warm.context()
    out = ctx.Queue()
    procs = [warm.process(ctx, _wrap, (fn, r, world_size, store.port, out, args, allocator), f"rank{r}")
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            try:
                rank, value, error = out.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if r not in results and p.exitcode is not None]
                if dead:  # a rank that ended without a report (a crash) fails the test now, not at the timeout
                    rank, code = dead[0]
                    raise AssertionError(f"rank {rank} ended with exit code {code} before reporting") from None
                if time.monotonic() >= deadline:
                    raise AssertionError(f"ranks did not finish within {timeout} s") from None
                continue
            if error:
                raise AssertionError(f"rank {rank} failed:\n{error}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()
    return [results[r] for r in range(world_size)]


def context(method_name: str, rank: int, world_size: int, params: dict | None = None, workload: str = "digits-mlp",
            run_dir: Path | None = None, seed: int = 0, options: dict | None = None):
    """A RunContext for `method_name` on `workload`, as the worker builds it (the process group must exist)."""
    import torch
    import torch.distributed as dist

    from harness import registry
    from harness.comm.communicator import Communicator
    from harness.method import RunContext

    cls = registry.METHODS.get(method_name)
    merged = {k: v for k, v in registry.WORKLOADS.get(workload).hyperparameters.items() if k in cls.Params.model_fields}
    merged.update(params or {})
    group = dist.group.WORLD if dist.is_initialized() else None
    comm = Communicator(rank, world_size, group)
    instance = registry.WORKLOADS.get(workload).instantiate(options)
    ctx = RunContext(rank=rank, world_size=world_size, device=torch.device("cpu"), workload=instance,
                     params=cls.Params.model_validate(merged), comm=comm, seed=seed,
                     run_dir=run_dir or Path(tempfile.mkdtemp(prefix="dtbench-test-")), log=lambda kind, **f: None)
    torch.manual_seed(seed)
    return cls, ctx


def train_steps(method, steps: int, batch_size: int = 32, drain: bool = True,
                between: Callable[[int], None] | None = None) -> list[float]:
    """Train `method` for `steps` steps on the shared seed-0 data order, as the runner feeds it; the losses.
    `between(t)` runs after step t (where the runner evaluates); `drain=False` leaves microbatches in flight."""
    from harness.data.tensors import Batch, DataOrder

    data = method.ctx.workload.train
    order = DataOrder(len(data), batch_size, seed=0)
    losses = []
    for t in range(steps):
        losses.append(method.train_step(Batch(t, t / order.steps_per_epoch, order.batch(t), data, 0)).loss)
        if between is not None:
            between(t)
    if drain:
        method.end_training()
    return losses
