"""Q-FB's memory: the lanes keep nothing from one step to the next, and hold at most their credits, the bound the
plan walks."""

from __future__ import annotations

import threading

import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from harness.memory.peak import AllocatorPeak
from harness.schedule.held import in_flight_peaks
from harness.schedule.ir import Op, split_lanes
from methods.pipeline.core.placement import Placement, place
from methods.pipeline.qfb.credits import lane_credits, lane_order
from methods.pipeline.qfb.schedule import qfb_tick

CPU = torch.device("cpu")
END = "test::step_end_{}"


def _held_after_steps(rank: int, world_size: int, params: dict, steps: int) -> list[int]:
    """The bytes the allocator had handed out (net, from the method's construction) at the end of each step, as
    the rank's meter sees them (its lane threads join it through harness.memory.peak.thread)."""
    meter = AllocatorPeak(CPU, first=1, steps=steps)
    meter.start()
    cls, ctx = context("qfb", rank, world_size, params)
    method = cls(ctx)
    meter.pause()
    data = ctx.workload.train
    order = DataOrder(len(data), params["batch_size"], seed=0)
    for t in range(steps):
        meter.begin_step()
        method.train_step(Batch(t, 0.0, order.batch(t), data, 0))
        with torch.profiler.record_function(END.format(t)):
            pass
        meter.end_step()
    method.finish()
    events = [e for per_thread in meter._events for lst in per_thread for e in lst]
    zero = events[0]
    marks = sorted((zero.cpu_elapsed_us(e), e.name()) for e in events
                   if e.kind() == "push" and e.name().startswith("test::"))
    changes = sorted((zero.cpu_elapsed_us(e), e.cpu_memory_usage()) for e in events if e.kind() == "memory_alloc")
    return [sum(delta for when, delta in changes if when <= at) for at, _ in marks]


def test_one_stages_lanes_hold_the_same_bytes_after_every_step():
    """The lane threads let go of a step's batch within the step (they held it until the next step's job came,
    and freed it where the meter does not look: +8,192 bytes a step on digits-mlp, the batch's x)."""
    held = _held_after_steps(0, 1, {"stages": 1, "microbatches": 4, "lanes": 2, "batch_size": 32}, 12)
    assert held[11] == held[1], held


def test_two_ranks_lanes_hold_the_same_bytes_after_every_step():
    """On a 2-stage pipeline, each rank: the first stage's x (8,192 bytes) and the last stage's y (256 bytes) were
    kept a step too long and freed unseen."""
    for rank, held in enumerate(spawn(_held_after_steps, 2, {"microbatches": 4, "lanes": 2, "batch_size": 32}, 12)):
        assert held[11] == held[1], (rank, held)


def test_the_lanes_order_under_credits_holds_each_stages_credit():
    """Two stages, M = 4, exact: the one-lane order holds 2 microbatches at the first stage and 1 at the last, so
    their credits are 3 and 2, and the lanes' worst order runs as many forwards as those allow before a backward."""
    steps = [place([qfb_tick(s, 2, 4, t, "exact") for s in range(2)], Placement.one_per_rank(2)) for t in range(3)]
    credits = lane_credits(steps)
    assert credits == {(0, 0): 3, (1, 1): 2}
    ordered = lane_order(steps, credits)
    computes = [[(a.op.value[0], a.mb) for a in actions if a.op in (Op.FORWARD, Op.BACKWARD)] for actions in ordered[1]]
    assert computes[0] == [("f", 0), ("f", 1), ("f", 2), ("b", 0), ("f", 3), ("b", 1), ("b", 2), ("b", 3)]
    assert computes[1] == [("f", 0), ("f", 1), ("b", 0), ("f", 2), ("b", 1), ("f", 3), ("b", 2), ("b", 3)]
    assert in_flight_peaks(ordered) == credits
    for step, merged in zip(steps, ordered, strict=True):  # each lane keeps its own order
        assert [split_lanes(a) for a in step] == [split_lanes(a) for a in merged]


def test_a_forward_waits_for_a_credit_while_the_backward_lane_lags():
    """One stage, M = 4, two lane threads: its credit is 2. The backward lane's first backward is held back until
    the forward lane either ran every forward (no credit enforced: the stage would hold 4) or waits for a credit."""
    cls, ctx = context("qfb", 0, 1, {"stages": 1, "microbatches": 4, "lanes": 2, "batch_size": 32})
    method = cls(ctx)
    stage = next(iter(method.workers.values()))
    assert stage.credits == 2
    blocked, forwards_done = threading.Event(), threading.Event()
    take, forward, backward = stage.take_credit, stage.forward, stage.backward

    def taking(key):
        if key not in stage.holding and len(stage.holding) >= stage.credits:
            blocked.set()
        take(key)

    def forwarding(key, *args, **kwargs):
        out = forward(key, *args, **kwargs)
        if key[1] == 3:
            forwards_done.set()
        return out

    def lagging(key, *args, **kwargs):
        if key == (0, 0):  # the first window's first backward: only once the forward lane has gone as far as it may
            while not (blocked.is_set() or forwards_done.is_set()):
                blocked.wait(0.01)
        return backward(key, *args, **kwargs)

    stage.take_credit, stage.forward, stage.backward = taking, forwarding, lagging
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    method.train_step(Batch(0, 0.0, order.batch(0), data, 0))
    method.finish()
    assert blocked.is_set()
    assert stage.run_peak.microbatches == 2
