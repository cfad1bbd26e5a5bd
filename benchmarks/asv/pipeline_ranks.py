"""Rank functions for the pipeline peer benchmarks: our executors against torch.distributed.pipelining's schedules
(GPipe, 1F1B, interleaved 1F1B) on the same split, in the same processes, in alternating blocks."""

from __future__ import annotations

import resource
import statistics
from typing import Any

from dtbench_bench_ranks import interleaved

VARIANTS = ("ours_gpipe", "torch_gpipe", "ours_1f1b", "torch_1f1b", "ours_interleaved", "torch_interleaved")


def stage_modules(rank: int, world_size: int, stages: int, width: int, layers: int) -> dict[int, Any]:
    """This rank's stages (s = rank, rank + world_size, ...) of `layers` Linear(width, width) built with seed 0,
    layers / stages each: the same weights for our executors and torch's."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    full = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    per = layers // stages
    return {s: full[s * per:(s + 1) * per] for s in range(rank, stages, world_size)}


def our_stages(rank: int, world_size: int, stages: int, width: int, layers: int) -> dict[int, Any]:
    """stage_modules as our Stages: live weights, SGD (lr 1e-4), cross-entropy on the last."""
    import torch
    from torch import nn

    from methods.pipeline.core.stage import Stage
    from methods.pipeline.core.versions import Live

    return {s: Stage(s, stages, m, torch.optim.SGD(m.parameters(), lr=1e-4), Live(m), nn.functional.cross_entropy)
            for s, m in stage_modules(rank, world_size, stages, width, layers).items()}


def microbatch_views(held: Any, stages: int, x: Any, y: Any, microbatches: int) -> dict[int, Any]:
    """The Microbatches of the stages in `held`: x's and y's equal slices on the first and the last stage."""
    import torch

    from methods.pipeline.core.executor import Microbatches

    size = len(x) // microbatches
    keys = [(0, m) for m in range(microbatches)]
    views = {s: Microbatches(sizes=dict.fromkeys(keys, size)) for s in held}
    if 0 in views:
        views[0].inputs = dict(zip(keys, torch.split(x, size), strict=True))
    if stages - 1 in views:
        views[stages - 1].targets = dict(zip(keys, torch.split(y, size), strict=True))
        views[stages - 1].scales = dict.fromkeys(keys, 1.0 / microbatches)
    return views


def torch_schedule_step(sched: Any, rank: int, world_size: int, x: Any, y: Any) -> None:
    """One step of a torch.distributed.pipelining schedule: the inputs on the first rank, the targets on the last."""
    if rank == 0:
        sched.step(x)
    elif rank == world_size - 1:
        sched.step(target=y)
    else:
        sched.step()


def torch_step(rank: int, world_size: int, stages: int, width: int, layers: int, cls: Any, several: bool, x: Any,
               y: Any, microbatches: int) -> Any:
    """One step of torch.distributed.pipelining's schedule `cls` on this rank's stage_modules (all of them when
    `several`, as interleaved schedules take a list, else the one), with the SGD update our executors do."""
    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage

    local = stage_modules(rank, world_size, stages, width, layers)
    optimizer = torch.optim.SGD([p for m in local.values() for p in m.parameters()], lr=1e-4)
    made = [PipelineStage(m, s, stages, torch.device("cpu")) for s, m in local.items()]
    sched = cls(made if several else made[0], n_microbatches=microbatches, loss_fn=nn.functional.cross_entropy)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch_schedule_step(sched, rank, world_size, x, y)
        optimizer.step()
    return step


def pipeline_against_torch(rank: int, world_size: int, rounds: int, steps: int, width: int = 2048, layers: int = 8,
                           batch: int = 256, microbatches: int = 8, chunks: int = 2,
                           exchange: str = "prepost") -> dict[str, Any]:
    """Step times (s/step per block) of our gpipe, 1f1b and interleaved-1f1b executors and of torch's ScheduleGPipe,
    Schedule1F1B and ScheduleInterleaved1F1B: `layers` Linear(width, width), one stage per rank (layers / world_size
    each) or `chunks` stages per rank (layers / (world_size · chunks) each), the same microbatches, loss and SGD
    update; our gpipe and 1f1b with `exchange` (their parameter: "prepost" or "fused"; interleaved always
    pre-posts). Also the per-step trace events of our gpipe and interleaved steps on this rank, for the bubbles, and the
    mean minor page faults per step of each variant (`page_faults`: this process, every thread)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    from harness.comm.communicator import Communicator
    from methods.pipeline.core.executor import ProcessExecutor, Wire
    from methods.pipeline.core.placement import Placement, place
    from methods.pipeline.flushed import schedules
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g)
    y = torch.randint(0, width, (batch,), generator=g)
    comm = Communicator(rank, world_size, dist.group.WORLD)

    def ours(stages: int, plan: Placement, actions: list, traces: list | None, overlap: bool = True):
        made = our_stages(rank, world_size, stages, width, layers)
        executor = ProcessExecutor(rank, made, comm, plan, Wire([(width,)] * (stages + 1)), overlap=overlap)
        views = microbatch_views(made, stages, x, y, microbatches)

        def step() -> None:
            trace = executor.run(actions, views)
            if traces is not None:
                traces.append(trace.events)
        return step, executor

    def theirs(stages: int, cls):
        return torch_step(rank, world_size, stages, width, layers, cls, cls is ScheduleInterleaved1F1B, x, y,
                          microbatches)

    flat, deep = world_size, world_size * chunks
    gpipe_traces: list = []
    interleaved_traces: list = []
    one_stage = Placement.one_per_rank(flat)
    prepost = exchange == "prepost"  # "fused": ExchangedPipeline's executor option (methods/pipeline/flushed/base.py)
    ours_gpipe, ex1 = ours(flat, one_stage, place(schedules.gpipe(flat, microbatches), one_stage)[rank],
                           gpipe_traces, prepost)
    ours_1f1b, ex2 = ours(flat, one_stage, place(schedules.one_f_one_b(flat, microbatches), one_stage)[rank], None,
                          prepost)
    ours_inter, ex3 = ours(deep, Placement.interleaved(world_size, chunks),
                           schedules.interleaved_1f1b(world_size, chunks, microbatches)[rank], interleaved_traces)
    variants = {"ours_gpipe": ours_gpipe, "torch_gpipe": theirs(flat, ScheduleGPipe), "ours_1f1b": ours_1f1b,
                "torch_1f1b": theirs(flat, Schedule1F1B), "ours_interleaved": ours_inter,
                "torch_interleaved": theirs(deep, ScheduleInterleaved1F1B)}
    for _ in range(2):  # warm-up (the heap grows to its peak, lazy set-up), whose traces are not kept
        for fn in variants.values():
            fn()
    gpipe_traces.clear()
    interleaved_traces.clear()
    faults = {name: [] for name in variants}  # minor page faults of this process per step (every thread's)

    def counted(name: str, fn):
        def step() -> None:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            fn()
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return step

    times: dict[str, Any] = interleaved({name: counted(name, fn) for name, fn in variants.items()}, rounds, steps,
                                        warmup=0, barrier_after=True)
    times["page_faults"] = {name: statistics.mean(values) for name, values in faults.items()}
    for executor in (ex1, ex2, ex3):
        executor.flush()
    times["gpipe_traces"] = gpipe_traces
    times["interleaved_traces"] = interleaved_traces
    return times
