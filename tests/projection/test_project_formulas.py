"""The projection's formulas on hand-computed cases: links and collectives, DDP's buckets (against torch's), the
data-parallel step with overlap and compression, and block-cost interpolation."""

from __future__ import annotations

import pytest
import torch

from _dist import spawn
from harness.models.simple import mlp
from harness.project.dataparallel import Bucket, DataParallelCosts, data_parallel_step, ddp_buckets
from harness.project.links import (
    WIRE_EFFICIENCY,
    Link,
    collective_s,
    link_of,
)
from harness.project.profile import BlockCosts, default_batch_sizes

LINK = Link("test", bandwidth=100.0, alpha_s=0.01)  # 100 bytes/s, 10 ms per message


def test_collectives_follow_the_alpha_beta_formulas():
    # ring all-reduce 2(N-1)/N n/B + 2(N-1) alpha: N=4, n=400 -> 1.5 * 4 + 6 * 0.01
    assert collective_s("all_reduce", 400, 4, LINK) == pytest.approx(6.06)
    assert collective_s("all_reduce", 400, 2, LINK) == pytest.approx(4.02)
    assert collective_s("all_gather", 100, 3, LINK) == pytest.approx(2 * (1.0 + 0.01))
    assert collective_s("broadcast", 100, 5, LINK) == pytest.approx(4.0 + 0.01)
    for kind in ("all_reduce", "all_gather", "broadcast"):
        assert collective_s(kind, 1e9, 1, LINK) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        collective_s("reduce_scatter", 1, 2, LINK)


def test_links_take_rate_efficiency_and_latency_from_the_network_text():
    link = link_of("100mbit")
    assert link.bandwidth == pytest.approx(100e6 * WIRE_EFFICIENCY / 8)
    assert link.alpha_s == 0.0
    assert link_of("1gbit", latency_s=20e-6).alpha_s == pytest.approx(20e-6)
    assert link_of("1gbit,latency=1ms", latency_s=20e-6).alpha_s == pytest.approx(1e-3)  # the network's own wins
    assert link_of("unlimited", unshaped_rate_bps=8e9).bandwidth == pytest.approx(1e9)
    assert link_of("", unshaped_rate_bps=8e9).bandwidth == pytest.approx(1e9)  # loopback
    with pytest.raises(ValueError):
        link_of("fast")


def test_ddp_buckets_close_at_their_caps_in_gradient_ready_order():
    # blocks: [w 1000, b 10], [w 3000, b 20]; caps 1500 then 2500 -> ready order b20 w3000 | b10 w1000
    buckets = ddp_buckets([[1000, 10], [3000, 20]], first_cap=1500, cap=2500)
    assert buckets == [Bucket(3020, 1), Bucket(1010, 0)]
    assert ddp_buckets([[10], [20]], first_cap=1000) == [Bucket(30, 0)]


def _torch_buckets(rank: int, world_size: int, shapes: list[tuple[int, int, int]]) -> list[list[int]]:
    from torch.nn.parallel import DistributedDataParallel

    seen = []
    for in_features, hidden, depth in shapes:
        model = DistributedDataParallel(mlp(in_features, hidden, depth, 10))
        sizes: list[int] = []

        def hook(state, bucket, sizes=sizes):
            sizes.append(bucket.buffer().numel() * 4)
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        model.register_comm_hook(None, hook)
        for _ in range(2):  # the second step runs the rebuilt buckets
            sizes.clear()
            model(torch.randn(4, in_features)).sum().backward()
        seen.append(list(sizes))
    return seen


def test_ddp_buckets_equal_what_torch_ddp_reduces_from_its_second_step():
    shapes = [(256, 1024, 2), (64, 128, 2), (256, 512, 4), (32, 700, 3)]
    torch_sizes = spawn(_torch_buckets, 1, shapes)[0]
    for (in_features, hidden, depth), sizes in zip(shapes, torch_sizes, strict=True):
        blocks = mlp(in_features, hidden, depth, 10)
        param_bytes = [[p.numel() * 4 for p in block.parameters()] for block in blocks]
        assert [b.nbytes for b in ddp_buckets(param_bytes)] == sizes


def test_data_parallel_step_overlaps_buckets_with_the_backward():
    # forward 1+1; backward of block 1 = 3 s, then bucket 0 (100 B, all-reduce over 2 ranks: 100/100 = 1 s) runs
    # 5..6 while block 0's backward runs 5..7; bucket 1 (50 B: 0.5 s) runs 7..7.5; the update ends at 8.
    costs = DataParallelCosts([1.0, 1.0], [2.0, 3.0], 0.5, [Bucket(100, 1), Bucket(50, 0)])
    parts = data_parallel_step(costs, 2, Link("x", 100.0))
    assert parts.step_s == pytest.approx(8.0)
    assert parts.compute_s == pytest.approx(7.5)
    assert parts.exposed_comm_s == pytest.approx(0.5)
    assert parts.comm_s == pytest.approx(1.5)
    assert parts.compression_s == 0.0


def test_data_parallel_step_adds_compression_on_the_backward_and_decoding_after_each_collective():
    # shares 2/3 and 1/3: compress 0.2 and 0.1 on the backward, payloads 50 and 25 B all-gathered (0.5, 0.25 s),
    # decoded in 0.4 and 0.2 s: bucket 0 5.2..5.7, decode ..6.1; bucket 1 launched at 7.3, 7.3..7.55, decode
    # ..7.75 (all after the backward ended at 7.3); + update 0.5 = 8.25
    costs = DataParallelCosts([1.0, 1.0], [2.0, 3.0], 0.5, [Bucket(100, 1), Bucket(50, 0)], compress_s=0.3,
                              decompress_s=0.6, payload_ratio=0.5, collective="all_gather")
    parts = data_parallel_step(costs, 2, Link("x", 100.0))
    assert parts.step_s == pytest.approx(8.25)
    assert parts.compression_s == pytest.approx(0.3 + 0.2)
    assert parts.exposed_comm_s == pytest.approx(0.25)
    assert parts.comm_s == pytest.approx(0.75)
    assert parts.step_s == pytest.approx(parts.compute_s + parts.compression_s + parts.exposed_comm_s)


def test_data_parallel_step_on_one_rank_is_compute_alone():
    costs = DataParallelCosts([1.0], [2.0], 0.5, [Bucket(100, 0)])
    assert data_parallel_step(costs, 1, LINK).step_s == pytest.approx(3.5)


def test_block_costs_interpolate_linearly_and_flag_extrapolation():
    costs = BlockCosts((2, 4, 8), ((1.0, 10.0), (2.0, 20.0), (6.0, 40.0)), ((2.0, 0.0), (4.0, 0.0), (8.0, 0.0)),
                       (4.0, 4.0), ((8,), (4,)), 0.1)
    forward, backward, outside = costs.at(6)
    assert forward == pytest.approx([4.0, 30.0])
    assert backward == pytest.approx([6.0, 0.0])
    assert not outside
    forward, _, outside = costs.at(16)  # the line through 4 and 8
    assert forward == pytest.approx([14.0, 80.0])
    assert outside
    assert costs.at(1)[0] == pytest.approx([0.5, 5.0])
    assert BlockCosts.from_dict(costs.to_dict()) == costs
    assert default_batch_sizes(48, [24]) == [1, 2, 4, 8, 16, 24, 32, 48]


def test_a_burst_shortens_each_collective_by_the_tokens_that_refilled_since_the_last():
    # each step: 3 s of compute, then a 100-byte all-reduce over 2 ranks (100 B/s: 1 s); the 50-byte burst has
    # refilled during the compute, so the collective takes 0.5 s, step after step
    costs = DataParallelCosts([1.0], [2.0], 0.0, [Bucket(100, 0)])
    assert data_parallel_step(costs, 2, Link("x", 100.0, burst_bytes=50.0)).step_s == pytest.approx(3.5)
    assert data_parallel_step(costs, 2, Link("x", 100.0)).step_s == pytest.approx(4.0)


def test_emulated_links_carry_the_emulations_tbf_burst():
    assert link_of("100mbit").burst_bytes == 0.0
    assert link_of("100mbit", emulated=True).burst_bytes == pytest.approx(96 * 1024 * WIRE_EFFICIENCY)
    assert link_of("100gbit", emulated=True).burst_bytes == pytest.approx(100e9 / 8 / 1000 * WIRE_EFFICIENCY)
    assert link_of("unlimited", emulated=True).burst_bytes == 0.0


def test_profiling_measures_every_block_at_every_size_and_leaves_the_model_as_it_was():
    from harness.project.profile import profile_model

    model = mlp(8, 16, 1, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    costs = profile_model(list(model), torch.randn(5, 8), [1, 4], repeats=2, warmup=1)
    assert costs.batch_sizes == (1, 4)
    assert [len(row) for row in costs.forward_s] == [2, 2] and [len(row) for row in costs.backward_s] == [2, 2]
    assert all(t > 0 for row in costs.forward_s + costs.backward_s for t in row)
    assert costs.activation_bytes == (16 * 4, 3 * 4)  # per sample
    assert costs.param_bytes == ((16 * 8 * 4, 16 * 4), (3 * 16 * 4, 3 * 4))
    assert costs.optimizer_s > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_step_seconds_takes_a_quantile_per_payload_group_weighted_by_its_steps():
    import pandas as pd

    from harness.project.measured import step_seconds

    # rank 0: steps 2..7 take 1, 1, 9 (a burst of other work), 1 s at payload 0.5, then 3, 3 s at payload 0.1
    times = [0, 1, 2, 11, 12, 15, 18]
    ratios = [0.5, 0.5, 0.5, 0.5, 0.5, 0.1, 0.1]
    train = pd.DataFrame({"rank": 0, "step": range(1, 8), "train_time_s": times,
                          "payload_bytes": [r * 100 for r in ratios], "dense_bytes": 100})
    value, steps = step_seconds(train)
    assert steps == 7
    assert value == pytest.approx((1.0 * 4 + 3.0 * 2) / 6)  # medians 1 and 3, weighted 4:2
    slow = train.assign(rank=1, train_time_s=[2 * t for t in times])
    assert step_seconds(pd.concat([train, slow]))[0] == pytest.approx(2 * value)  # the slowest rank


def test_crossings_find_where_the_gap_changes_sign():
    from harness.project.crossover import SCAN_BPS, crossings, rate_text

    roots = crossings(lambda bps: 1 / bps - 1 / 370e6, SCAN_BPS)
    assert roots == pytest.approx([370e6], rel=1e-5)
    assert crossings(lambda bps: 1.0, SCAN_BPS) == []
    assert rate_text(370e6) == "370mbit" and rate_text(2.5e9) == "2.5gbit"
