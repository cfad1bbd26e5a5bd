"""The communicator's byte accounting: each collective's rule, on real gloo processes, and the per-category ledger."""

from __future__ import annotations

import pytest
import torch

from _dist import spawn
from harness.comm.communicator import Communicator, Ledger, ring_all_gather_bytes, ring_all_reduce_bytes


def test_ring_formulas():
    assert ring_all_reduce_bytes(1000, 1) == 0
    assert ring_all_reduce_bytes(1000, 2) == 1000
    assert ring_all_reduce_bytes(1000, 4) == 1500
    assert ring_all_gather_bytes(100, 4) == 300


def test_ledger_rejects_unknown_category_and_splits_training_bytes():
    ledger = Ledger()
    ledger.add("gradients", 10, 20)
    ledger.add("control", 1, 1)
    ledger.add("eval", 5, 5)
    assert ledger.training_bytes() == (10, 20)
    assert ledger.by_category() == {"gradients": [10, 20], "control": [1, 1], "eval": [5, 5]}
    with pytest.raises(ValueError, match="unknown communication category 'grads'"):
        ledger.add("grads", 1, 1)


def _exercise(rank: int, world_size: int):
    import torch.distributed as dist

    comm = Communicator(rank, world_size, dist.group.WORLD)
    t = torch.full((250,), float(rank + 1))  # 1000 bytes
    comm.all_reduce(t, "gradients")
    gathered = comm.all_gather(torch.full((25,), float(rank)), "params")  # 100 bytes each
    b = torch.arange(10.0) if rank == 0 else torch.zeros(10)  # 40 bytes
    comm.broadcast(b, 0, "params")
    p2p = torch.full((5,), 7.0)  # 20 bytes
    if rank == 0:
        comm.send(p2p, 1, "activations")
    elif rank == 1:
        comm.recv(p2p, 0, "activations")
    fut = comm.all_reduce(torch.ones(4), "control", async_op=True)
    fut.wait()
    return t, [g[0].item() for g in gathered], b, p2p, comm.ledger.by_category(), fut.value()


def test_collectives_count_their_rule_on_real_processes():
    results = spawn(_exercise, 3)
    for rank, (t, gathered, b, p2p, by_cat, async_value) in enumerate(results):
        assert torch.equal(t, torch.full((250,), 6.0))
        assert gathered == [0.0, 1.0, 2.0]
        assert torch.equal(b, torch.arange(10.0))
        assert torch.equal(async_value, torch.full((4,), 3.0))  # async futures resolve to the tensor
        assert by_cat["gradients"] == [1333, 1333]  # 2 * 2/3 * 1000, rounded down
        bcast_sent, bcast_recv = (2 * 40, 0) if rank == 0 else (0, 40)
        assert by_cat["params"] == [200 + bcast_sent, 200 + bcast_recv]
        assert by_cat["control"] == [21, 21]  # 2 * 2/3 * 16
        if rank == 0:
            assert by_cat["activations"] == [20, 0]
        elif rank == 1:
            assert by_cat["activations"] == [0, 20]
            assert torch.equal(p2p, torch.full((5,), 7.0))
        else:
            assert "activations" not in by_cat
