"""Local parallelism: chunking, no gradient across chunks, one chunk = sgd, multi-process = virtual, ids, queue."""

from __future__ import annotations

import time

import pytest
import torch

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from methods.local.parts import chunk_ranges, make_head


def test_chunk_ranges():
    assert chunk_ranges(5, 2, "chunked") == [(0, 3), (3, 5)]
    assert chunk_ranges(3, 3, "chunked") == [(0, 1), (1, 2), (2, 3)]
    assert chunk_ranges(3, 2, "greedy") == [(0, 1), (1, 2), (2, 3)]
    assert chunk_ranges(5, 2, "overlapping") == [(0, 3), (2, 5)]
    with pytest.raises(ValueError, match="cannot cut 2 blocks into 3"):
        chunk_ranges(2, 3, "chunked")


def test_heads():
    x = torch.randn(4, 16, 8, 8)
    assert make_head("auto", (16, 8, 8), 10)(x).shape == (4, 10)
    assert make_head("auto", (32,), 10)(torch.randn(4, 32)).shape == (4, 10)
    assert make_head("mlp", (32,), 10, hidden=7)(torch.randn(4, 32)).shape == (4, 10)
    with pytest.raises(ValueError, match="dgl head needs"):
        make_head("dgl", (32,), 10)


def _train(method, steps, batch_size=32):
    data = method.ctx.workload.train
    order = DataOrder(len(data), batch_size, seed=0)
    for step in range(steps):
        method.train_step(Batch(step, 0.0, order.batch(step), data, 0))


def _flat(modules):
    return torch.cat([p.detach().flatten() for m in modules for p in m.parameters()])


def test_one_chunk_is_sgd():
    cls, ctx = context("local", 0, 1, {"chunks": 1})
    local = cls(ctx)
    cls, ctx = context("sgd", 0, 1)
    sgd = cls(ctx)
    _train(local, 5)
    _train(sgd, 5)
    assert torch.equal(_flat(local.blocks), _flat([sgd.model]))


@pytest.mark.parametrize("variant,upstream_changes", [("chunked", False), ("overlapping", True)])
def test_no_gradient_crosses_a_chunk_boundary(variant, upstream_changes):
    runs = []
    for perturb in (False, True):
        cls, ctx = context("local", 0, 1, {"chunks": 2, "variant": variant})
        method = cls(ctx)
        if perturb:  # a different downstream chunk: a different downstream loss at every step
            with torch.no_grad():
                for p in method.blocks[1][-1].parameters():
                    p.mul_(3.0)
        _train(method, 6)
        runs.append(method)
    upstream = [_flat([m.blocks[0], m.heads[0]]) for m in runs]
    assert torch.equal(upstream[0], upstream[1]) != upstream_changes  # overlapping shares a block: it must change
    assert not torch.equal(_flat([runs[0].blocks[1]]), _flat([runs[1].blocks[1]]))


def test_eval_reports_every_head():
    cls, ctx = context("local", 0, 1, {"variant": "greedy"})
    method = cls(ctx)
    _train(method, 20)
    result = method.evaluate(ctx.workload.test)
    assert len(result.extra["head_accuracy"]) == 3 and result.extra["head_accuracy"][-1] == result.accuracy
    assert all(0.3 < a <= 1.0 for a in result.extra["head_accuracy"])  # all well above chance (0.1)


def _two_ranks(rank, world_size, steps, depth, slow_consumer):
    cls, ctx = context("local", rank, world_size, {"depth": depth})
    method = cls(ctx)
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    in_flight = []
    for step in range(steps):
        if slow_consumer and rank == 1:
            time.sleep(0.02)
        stats = method.train_step(Batch(step, 0.0, order.batch(step), data, 0))
        in_flight.append(stats.extra.get("in_flight"))
    wait = method.sender.stats.wait_s if method.sender else None
    most = method.sender.stats.max_in_flight if method.sender else None
    method.finish()
    return _flat([method.blocks[rank], method.heads[rank]]), in_flight, wait, most


@pytest.mark.slow
def test_two_processes_equal_the_virtual_mode_and_keep_the_queue_bound():
    (p0, in_flight, wait, most), (p1, _, _, _) = spawn(_two_ranks, 2, 12, 3, True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: the same reduction order in every matmul
    try:
        cls, ctx = context("local", 0, 1, {"chunks": 2})
        virtual = cls(ctx)
        _train(virtual, 12)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(p0, _flat([virtual.blocks[0], virtual.heads[0]]))
    assert torch.equal(p1, _flat([virtual.blocks[1], virtual.heads[1]]))
    # The consumer is slow: the producer fills the queue to its bound, never past it, and waits for credits.
    assert most == 3 and max(in_flight) <= 3 and wait > 0.05


def _misaligned(rank, world_size):
    cls, ctx = context("local", rank, world_size, {"depth": 2})
    method = cls(ctx)
    data = ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    step = 1 if rank == 1 else 0  # rank 1 expects another step's samples than rank 0 sends
    message = None
    try:
        method.train_step(Batch(step, 0.0, order.batch(step), data, 0))
    except RuntimeError as exc:
        message = str(exc)
    # Rank 1 too: the credit for the message it took (an isend, posted before its check raised) goes out before
    # it exits, and rank 0's drain waits for that credit. Returning at once raced it: rank 0's drain then failed on
    # a closed connection whenever rank 1's process ended before the credit left.
    method.finish()
    return message


@pytest.mark.slow
def test_sample_ids_travel_with_activations_and_a_mismatch_is_caught():
    sender, receiver = spawn(_misaligned, 2)
    assert sender is None and receiver and "other sample ids" in receiver
