"""Rank functions for the zero-bubble peer benchmark: our zb-h1 and 1f1b executors against torch.distributed.
pipelining's ScheduleInterleavedZeroBubble and Schedule1F1B on the same split, in the same processes, in alternating
blocks."""

from __future__ import annotations

from typing import Any

from dtbench_bench_ranks import interleaved
from pipeline_ranks import microbatch_views, our_stages, torch_step

VARIANTS = ("ours_zb_h1", "torch_zero_bubble", "ours_1f1b", "torch_1f1b")


def zero_bubble_against_torch(rank: int, world_size: int, rounds: int, steps: int, width: int = 2048,
                              layers: int = 8, batch: int = 256, microbatches: int = 8) -> dict[str, Any]:
    """Step times (s/step per block) of our zb-h1 and 1f1b executors and of torch's ScheduleInterleavedZeroBubble
    (given one stage per rank, the shape of ZB-H1) and Schedule1F1B: `layers` Linear(width, width), one stage per
    rank, the same microbatches, loss and SGD update. Also our per-step trace events (zb_h1_traces, 1f1b_traces)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleavedZeroBubble

    from harness.comm.communicator import Communicator
    from methods.pipeline.core.executor import ProcessExecutor, Wire
    from methods.pipeline.core.placement import Placement, place
    from methods.pipeline.flushed import schedules

    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g)
    y = torch.randint(0, width, (batch,), generator=g)
    comm = Communicator(rank, world_size, dist.group.WORLD)
    plan = Placement.one_per_rank(world_size)
    executors = []

    def ours(make, traces: list):
        made = our_stages(rank, world_size, world_size, width, layers)
        executor = ProcessExecutor(rank, made, comm, plan, Wire([(width,)] * (world_size + 1)))
        executors.append(executor)
        views = microbatch_views(made, world_size, x, y, microbatches)
        actions = place(make(world_size, microbatches), plan)[rank]

        def step() -> None:
            traces.append(executor.run(actions, views).events)
        return step

    def theirs(cls):
        return torch_step(rank, world_size, world_size, width, layers, cls, cls is ScheduleInterleavedZeroBubble,
                          x, y, microbatches)

    zb_traces: list = []
    one_traces: list = []
    variants = {"ours_zb_h1": ours(schedules.zb_h1, zb_traces),
                "torch_zero_bubble": theirs(ScheduleInterleavedZeroBubble),
                "ours_1f1b": ours(schedules.one_f_one_b, one_traces), "torch_1f1b": theirs(Schedule1F1B)}
    for _ in range(2):  # warm-up, whose traces are not kept
        for fn in variants.values():
            fn()
    zb_traces.clear()
    one_traces.clear()
    times: dict[str, Any] = interleaved(variants, rounds, steps, warmup=0, barrier_after=True)
    for executor in executors:
        executor.flush()
    times["zb_h1_traces"] = zb_traces
    times["1f1b_traces"] = one_traces
    return times
