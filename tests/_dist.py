"""Test helper: run a function on W real gloo processes (one thread each, forked from the launcher's warm
forkserver, harness/launch/warm.py) and collect what each returns."""

from __future__ import annotations

import pickle
import queue
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _wrap(fn: Callable[..., Any], rank: int, world_size: int, port: int, out: Any, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        # plain pickle: torch's shared-memory tensor passing dies with the child process
        out.put((rank, pickle.dumps(fn(rank, world_size, *args)), None))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        out.put((rank, None, traceback.format_exc()))


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """fn(rank, world_size, *args) on every rank; returns the results ordered by rank; raises on any failure."""
    import torch.distributed as dist

    from harness.launch import warm

    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    ctx = warm.context()
    out = ctx.Queue()
    procs = [warm.process(ctx, _wrap, (fn, r, world_size, store.port, out, args), f"rank{r}")
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, value, error = out.get(timeout=timeout)
            if error:
                raise AssertionError(f"rank {rank} failed:\n{error}")
            results[rank] = pickle.loads(value)
    except queue.Empty:
        raise AssertionError(f"ranks did not finish within {timeout} s") from None
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
