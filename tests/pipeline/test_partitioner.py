"""PipeDream's partitioner and profiler: hand-solved splits, a brute-force cross-check, side-effect-free profiles."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from torch import nn

from harness.models.simple import mlp
from harness.split import uniform_split
from methods.pipeline.core.block_profile import BlockProfile, profile_blocks, profiles_from_dicts, profiles_to_dicts
from methods.pipeline.core.partitioner import (
    PartitionPlan,
    pipedream_partition,
    predict,
    straight_partition,
)

GB = 1e9


def blocks(times, params=None, activations=None) -> list[BlockProfile]:
    """Profiles with the given compute times (split 1:2 into forward and backward), parameter and activation bytes."""
    params = params or [0] * len(times)
    activations = activations or [0] * len(times)
    return [
        BlockProfile(forward_s=t / 3, backward_s=2 * t / 3, activation_bytes=int(a), param_bytes=int(w))
        for t, w, a in zip(times, params, activations, strict=True)
    ]


# --- straight pipelines (one worker per stage) ---


def test_equal_blocks_split_in_the_middle():
    plan = straight_partition(blocks([1, 1, 1, 1]), stages=2)
    assert plan.ranges == [(0, 2), (2, 4)]
    assert plan.replicas == [1, 1]
    assert plan.slowest_s == pytest.approx(2.0)


def test_heavy_first_block_gets_its_own_stage():
    plan = straight_partition(blocks([3, 1, 1, 1]), stages=2)
    assert plan.ranges == [(0, 1), (1, 4)]
    assert plan.slowest_s == pytest.approx(3.0)


def test_large_activation_moves_the_cut():
    times = [1, 1, 1, 1.5]
    assert straight_partition(blocks(times), stages=2).ranges == [(0, 2), (2, 4)]
    # block 1's output costs 2 * 2.5e9 / 1e9 = 5 s to cross a boundary, so the cut avoids it
    plan = straight_partition(blocks(times, activations=[0, 2.5 * GB, 0, 0]), stages=2, bandwidth=GB)
    assert plan.ranges == [(0, 3), (3, 4)]
    assert plan.slowest_s == pytest.approx(3.0)


def test_boundary_transfer_is_charged_to_the_receiving_stage():
    plan = predict(blocks([1, 1], activations=[GB, 7]), [(0, 1), (1, 2)], bandwidth=GB)
    assert [s.transfer_s for s in plan.stages] == [0.0, pytest.approx(2.0)]
    assert plan.slowest_s == pytest.approx(2.0)


# --- PipeDream's DP with replication ---


def test_replicating_a_heavy_block_with_few_params_wins():
    # data parallel over all three workers would pay 4*2*4.5e9/(3e9) = 12 s of weight sync (4 s per minibatch)
    profiles = blocks([4, 2], params=[0, 4.5 * GB])
    plan = pipedream_partition(profiles, workers=3, bandwidth=GB)
    assert plan.ranges == [(0, 1), (1, 2)]
    assert plan.replicas == [2, 1]
    assert plan.slowest_s == pytest.approx(2.0)


def test_replicating_a_heavy_block_with_huge_params_loses_at_low_bandwidth():
    profiles = blocks([4, 1, 1], params=[1e9, 0, 0])
    slow = pipedream_partition(profiles, workers=3, bandwidth=1e6)
    assert slow.stages[0].replicas == 1
    assert slow.slowest_s == pytest.approx(4.0)
    assert slow.workers == 3
    fast = pipedream_partition(profiles, workers=3, bandwidth=1e15)
    assert fast.stages[0].replicas >= 2
    assert fast.slowest_s < 4.0


def test_all_workers_are_used_unless_idle_workers_are_allowed():
    profiles = blocks([1, 1], params=[GB, GB])
    forced = pipedream_partition(profiles, workers=3, bandwidth=1e6)
    assert forced.workers == 3
    assert forced.slowest_s > 100
    idle = pipedream_partition(profiles, workers=3, bandwidth=1e6, allow_idle_workers=True)
    assert idle.ranges == [(0, 1), (1, 2)]
    assert idle.replicas == [1, 1]
    assert idle.slowest_s == pytest.approx(1.0)


def test_max_stages_one_is_data_parallel():
    plan = pipedream_partition(blocks([3, 1, 1, 1], params=[10, 10, 10, 10]), workers=4, max_stages=1)
    assert plan.ranges == [(0, 4)]
    assert plan.replicas == [4]


def test_ties_prefer_one_stage_then_earlier_cuts():
    # with no parameters, data parallel over both workers (6/2) ties the split [0,2)+[2,4): one stage wins
    plan = pipedream_partition(blocks([1, 1, 1, 1]), workers=2)
    assert plan.ranges == [(0, 4)]
    assert plan.replicas == [2]
    # [1,1,1] on 2 straight stages: cuts at 1 and 2 both give 2; the earlier one wins
    assert straight_partition(blocks([1, 1, 1]), stages=2).ranges == [(0, 1), (1, 3)]


def all_plans(n: int, workers: int, max_stages: int | None, allow_idle: bool, replicate: bool):
    """Every contiguous split of n blocks with every replica assignment the problem allows."""
    for stages in range(1, min(n, workers) + 1):
        if max_stages is not None and stages > max_stages:
            break
        for cuts in itertools.combinations(range(1, n), stages - 1):
            edges = [0, *cuts, n]
            ranges = list(itertools.pairwise(edges))
            counts = itertools.product(range(1, workers + 1), repeat=stages) if replicate else [(1,) * stages]
            for replicas in counts:
                used = sum(replicas)
                if used == workers or (allow_idle and used < workers):
                    yield ranges, list(replicas)


def random_profiles(rng: random.Random, n: int) -> list[BlockProfile]:
    """Times of 0.1..3 s, and byte counts whose transfer and sync terms are of the same order at 1e9 B/s."""
    return blocks(
        [rng.choice([rng.uniform(0.1, 3), 1.0]) for _ in range(n)],
        params=[rng.choice([0, rng.uniform(0, 2 * GB)]) for _ in range(n)],
        activations=[rng.choice([0, rng.uniform(0, 1.5 * GB)]) for _ in range(n)],
    )


@pytest.mark.parametrize("seed", range(50))
def test_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    n, workers = rng.randint(2, 6), rng.randint(1, 4)
    max_stages = rng.choice([None, None, rng.randint(1, 3)])
    allow_idle = seed % 3 == 0
    profiles = random_profiles(rng, n)
    plan = pipedream_partition(profiles, workers, GB, max_stages, allow_idle_workers=allow_idle)
    brute = min(
        predict(profiles, ranges, GB, replicas).slowest_s
        for ranges, replicas in all_plans(n, workers, max_stages, allow_idle, replicate=True)
    )
    assert plan.slowest_s == pytest.approx(brute, rel=1e-9)
    assert plan.workers == workers or (allow_idle and plan.workers < workers)
    assert max_stages is None or len(plan.stages) <= max_stages
    assert plan == predict(profiles, plan.ranges, GB, plan.replicas)

    stages = rng.randint(1, n)
    straight = straight_partition(profiles, stages, GB)
    brute = min(
        predict(profiles, ranges, GB).slowest_s
        for ranges, _ in all_plans(n, stages, None, False, replicate=False)
        if len(ranges) == stages
    )
    assert len(straight.stages) == stages
    assert straight.slowest_s == pytest.approx(brute, rel=1e-9)


# --- uniform splits, predictions, serialisation, errors ---


def test_uniform_partition_gives_earlier_stages_the_extra_blocks():
    assert uniform_split(5, 2) == [(0, 3), (3, 5)]
    assert uniform_split(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert uniform_split(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_predict_scores_a_uniform_split():
    profiles = blocks([3, 1, 1, 1], params=[8, 0, 0, 0])
    plan = predict(profiles, uniform_split(4, 2))
    assert [s.compute_s for s in plan.stages] == [pytest.approx(4.0), pytest.approx(2.0)]
    assert plan.slowest_s == pytest.approx(4.0)
    replicated = predict(profiles, [(0, 1), (1, 4)], bandwidth=8.0, replicas=[2, 1])
    first = replicated.stages[0]
    assert first.sync_s == pytest.approx(4 * 1 * 8 / (8.0 * 2))
    assert first.predicted_s == pytest.approx(max(3.0, first.sync_s) / 2)


def test_plan_to_dict_is_json():
    plan = pipedream_partition(blocks([4, 2], params=[0, 4.5 * GB]), workers=3)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["workers"] == 3
    assert [(s["start"], s["end"], s["replicas"]) for s in data["stages"]] == [(0, 1, 2), (1, 2, 1)]
    assert isinstance(plan, PartitionPlan)
    assert "[0,1)x2" in str(plan)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pipedream_partition([], 2), "no block profiles"),
        (lambda: pipedream_partition(blocks([1]), 0), "workers"),
        (lambda: pipedream_partition(blocks([1]), 2, max_stages=0), "max_stages"),
        (lambda: pipedream_partition(blocks([1]), 2, bandwidth=0), "bandwidth"),
        (lambda: straight_partition(blocks([1, 1]), 3), "2 blocks into 3 stages"),
        (lambda: straight_partition(blocks([1, 1]), 0), "into 0 stages"),
        (lambda: uniform_split(2, 3), "2 blocks into 3 parts"),
        (lambda: predict(blocks([1, 1]), [(0, 1)]), "ranges end at block 1"),
        (lambda: predict(blocks([1, 1]), [(0, 1), (2, 2)]), "stage 1"),
        (lambda: predict(blocks([1, 1]), [(0, 2)], replicas=[1, 1]), "2 replica counts for 1 stages"),
        (lambda: predict(blocks([1, 1]), [(0, 2)], replicas=[0]), "0 replicas"),
        (lambda: predict(blocks([1, -1]), [(0, 2)]), "block 1"),
    ],
)
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- profiler ---


def test_profile_of_a_tiny_mlp():
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=5, depth=2, classes=3)
    model[1][0].weight.grad = torch.full_like(model[1][0].weight, 7.0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    profiles = profile_blocks(list(model), torch.randn(4, 6), repeats=3)
    assert len(profiles) == 3
    assert all(p.forward_s > 0 and p.backward_s > 0 for p in profiles)
    assert [p.activation_bytes for p in profiles] == [4 * 5 * 4, 4 * 5 * 4, 4 * 3 * 4]
    assert [p.param_bytes for p in profiles] == [(6 * 5 + 5) * 4, (5 * 5 + 5) * 4, (5 * 3 + 3) * 4]
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
        if name == "1.0.weight":
            assert torch.equal(p.grad, torch.full_like(p, 7.0))
        else:
            assert p.grad is None, name


def test_profile_leaves_buffers_and_rng_alone_and_takes_integer_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Sequential(nn.Flatten(), nn.BatchNorm1d(8), nn.Dropout(0.5)))
    example = torch.randint(0, 10, (3, 2))
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    rng_state = torch.get_rng_state()
    profiles = profile_blocks(list(model), example, repeats=2, warmup=0)
    assert [p.activation_bytes for p in profiles] == [3 * 2 * 4 * 4, 3 * 8 * 4]
    assert [p.param_bytes for p in profiles] == [10 * 4 * 4, 2 * 8 * 4]
    assert all(torch.equal(b, buffers[name]) for name, b in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng_state)


def test_profiles_round_trip_through_json():
    profiles = blocks([1, 2], params=[3, 4], activations=[5, 6])
    rows = json.loads(json.dumps(profiles_to_dicts(profiles)))
    assert profiles_from_dicts(rows) == profiles
    with pytest.raises(ValueError, match="missing"):
        profiles_from_dicts([{"forward_s": 1.0}])
