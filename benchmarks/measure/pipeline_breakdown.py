"""Where a pipeline step's time goes, ours against torch.distributed.pipelining's, in one pair of processes:
per rank, the seconds of forwards, backwards, updates and waits, and the minor page faults, per step.

Only the two executors of one schedule share the processes (as a dtbench run has one method per process), so the
heap is theirs alone: this is where glibc's defaults made our 1f1b ranks fault thousands of pages a step that torch's
did not (`--allocator system`; docs/benchmarks.md). Steps alternate one by one (ours, torch, torch, ours, ...),
each after a barrier; times are medians over steps of this rank's own clock. torch's side is timed by wrapping its
stage's forward_one_chunk and backward_one_chunk and the schedule's P2P waits.

    python benchmarks/measure/pipeline_breakdown.py [--schedule 1f1b|interleaved] [--steps 12]
        [--allocator retain|system]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks" / "asv")]


def breakdown(rank: int, world_size: int, schedule: str, steps: int, width: int = 2048, layers: int = 8,
              batch: int = 256, microbatches: int = 8) -> dict[str, Any]:
    """This rank's per-step medians: step seconds and page faults of each side, and seconds per kind of action."""
    import collections
    import resource
    import statistics
    import time

    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining.schedules as torch_schedules
    from pipeline_ranks import microbatch_views, our_stages, stage_modules, torch_schedule_step
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    from harness.comm.communicator import Communicator
    from methods.pipeline.core.executor import ProcessExecutor, Wire
    from methods.pipeline.core.placement import Placement, place
    from methods.pipeline.flushed import schedules

    chunks = 2 if schedule == "interleaved" else 1
    stages = world_size * chunks
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g)
    y = torch.randint(0, width, (batch,), generator=g)

    # ours
    made = our_stages(rank, world_size, stages, width, layers)
    if chunks == 1:
        plan = Placement.one_per_rank(stages)
        actions = place(schedules.one_f_one_b(stages, microbatches), plan)[rank]
    else:
        plan = Placement.interleaved(world_size, chunks)
        actions = schedules.interleaved_1f1b(world_size, chunks, microbatches)[rank]
    executor = ProcessExecutor(rank, made, Communicator(rank, world_size, dist.group.WORLD), plan,
                               Wire([(width,)] * (stages + 1)))
    views = microbatch_views(made, stages, x, y, microbatches)
    ours_parts: collections.Counter = collections.Counter()

    def ours() -> None:
        for event in executor.run(actions, views).events:
            kind = event.op if event.op in ("forward", "backward", "update") else "wait" if "recv" in event.op \
                else "send"
            ours_parts[kind] += event.end - event.start

    # torch's, with its stage's compute and the schedule's P2P timed
    theirs_local = stage_modules(rank, world_size, stages, width, layers)
    optimizer = torch.optim.SGD([p for m in theirs_local.values() for p in m.parameters()], lr=1e-4)
    their_stages = [PipelineStage(m, s, stages, torch.device("cpu")) for s, m in theirs_local.items()]
    if chunks == 1:
        sched = Schedule1F1B(their_stages[0], n_microbatches=microbatches, loss_fn=nn.functional.cross_entropy)
    else:
        sched = ScheduleInterleaved1F1B(their_stages, n_microbatches=microbatches, loss_fn=nn.functional.cross_entropy)
    their_parts: collections.Counter = collections.Counter()

    def timed(kind: str, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                their_parts[kind] += time.perf_counter() - start
        return call

    for stage in their_stages:
        stage.forward_one_chunk = timed("forward", stage.forward_one_chunk)
        stage.backward_one_chunk = timed("backward", stage.backward_one_chunk)
    saved_wait, saved_post = torch_schedules._wait_batch_p2p, torch_schedules._batch_p2p
    torch_schedules._wait_batch_p2p = timed("wait", saved_wait)
    torch_schedules._batch_p2p = timed("send", saved_post)  # posting sends and receives together

    def theirs() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch_schedule_step(sched, rank, world_size, x, y)
        start = time.perf_counter()
        optimizer.step()
        their_parts["update"] += time.perf_counter() - start

    sides = {"ours": (ours, ours_parts), "torch": (theirs, their_parts)}
    try:
        for _ in range(2):  # warm-up: the heap grows to its peak, lazy set-up
            for fn, _parts in sides.values():
                fn()
        for _fn, parts in sides.values():
            parts.clear()
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        faults: dict[str, list[int]] = {name: [] for name in sides}
        for index in range(steps):
            for name in (("ours", "torch") if index % 2 == 0 else ("torch", "ours")):
                dist.barrier()
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                sides[name][0]()
                seconds[name].append(time.perf_counter() - start)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        executor.flush()
    finally:
        torch_schedules._wait_batch_p2p, torch_schedules._batch_p2p = saved_wait, saved_post
    return {name: {"step_s": statistics.median(seconds[name]), "page_faults": statistics.mean(faults[name]),
                   **{kind: total / steps for kind, total in parts.items()}}
            for name, (_fn, parts) in sides.items()}


def main() -> None:
    from _dist import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=("1f1b", "interleaved"), default="1f1b",
                        help="1f1b on 2 stages, or interleaved 1F1B on 4 stages (2 per rank)")
    parser.add_argument("--steps", type=int, default=12, help="timed steps of each side")
    parser.add_argument("--allocator", choices=("retain", "system"), default="retain",
                        help="the ranks' malloc policy (harness/run/allocator.py)")
    parser.add_argument("--width", type=int, default=2048)
    a = parser.parse_args()
    if a.steps < 1:
        parser.error("--steps must be at least 1")
    ranks = spawn(breakdown, 2, a.schedule, a.steps, a.width, timeout=3600, allocator=a.allocator)
    kinds = ("forward", "backward", "update", "wait", "send")
    print(f"{a.schedule}: 8 x Linear({a.width}, {a.width}), batch 256, M = 8, 2 ranks x 1 thread, gloo, allocator "
          f"{a.allocator}; {a.steps} steps each, alternating (ms/step: step the median, parts the mean)")
    print(f"  {'rank side':12s} {'step':>7s} {'faults':>8s} " + " ".join(f"{k:>8s}" for k in kinds))
    for rank, result in enumerate(ranks):
        for side in ("ours", "torch"):
            r = result[side]
            print(f"  {rank} {side:10s} {1e3 * r['step_s']:7.2f} {r['page_faults']:8.0f} "
                  + " ".join(f"{1e3 * r.get(k, 0.0):8.2f}" for k in kinds))
        print(f"  {rank} ours/torch {result['ours']['step_s'] / result['torch']['step_s']:7.3f}")


if __name__ == "__main__":
    main()
