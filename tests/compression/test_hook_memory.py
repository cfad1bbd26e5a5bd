"""What a compressed ddp's comm hook allocates is freed where the allocator's meter sees it (methods/compression/
retire.py): on real gloo ranks, the bytes a rank holds after each step stop changing once its state exists (they grew
by the hook's payloads every step while gloo's worker thread dropped the last references), and what the hook kept for
a step is let go of after the backward."""

from __future__ import annotations

import pytest

from _dist import context, spawn


def _held_after_each_step(rank, world_size, method_name, params, steps):
    import torch

    from harness.data.tensors import Batch, DataOrder
    from harness.memory.peak import AllocatorPeak

    meter = AllocatorPeak(torch.device("cpu"), first=2, steps=steps)  # records every step (the window: 2..steps+1)
    cls, ctx = context(method_name, rank, world_size, params)
    meter.start()
    method = cls(ctx)
    meter.pause()
    order = DataOrder(len(ctx.workload.train), 32, seed=0)
    held, kept = [], []
    for step in range(steps):
        meter.begin_step()
        method.train_step(Batch(step, 0.0, order.batch(step), ctx.workload.train, 0))
        meter.end_step()
        kept.append(len(method.retired))
        events = [e for per_thread in meter._events for lst in per_thread for e in lst if e.kind() == "memory_alloc"]
        held.append(sum(e.cpu_memory_usage() for e in events))
    meter.stop()
    return held, kept


@pytest.mark.slow
@pytest.mark.parametrize(("method", "params", "steady_from"), [
    ("qsgd", {}, 1), ("onebit", {}, 1), ("fp16", {}, 1), ("powersgd", {"rank": 2, "start_iter": 2}, 2)])
def test_a_step_holds_no_more_than_the_last_once_the_state_exists(method, params, steady_from):
    for rank, (held, kept) in enumerate(spawn(_held_after_each_step, 2, method, params, 5)):
        assert held[steady_from:] == [held[steady_from]] * (5 - steady_from), f"rank {rank}: {held}"
        assert kept == [0] * 5  # released after every backward
