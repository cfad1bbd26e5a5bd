"""The antichain DP: PipeDream's partitioner on chains (same plans, ties included), brute force on small random DAGs
(equal and unequal ranks and links), and the down-sets and cuts of a graph with a skip connection."""

from __future__ import annotations

import itertools
import random

import pytest

from methods.pipeline.apapo.antichain import Hardware, antichain_partition, predict
from methods.pipeline.apapo.graph import LayerGraph, members, random_dag
from methods.pipeline.core.block_profile import BlockProfile
from methods.pipeline.core.partitioner import pipedream_partition, straight_partition


def _profiles(rng: random.Random, n: int) -> list[BlockProfile]:
    return [BlockProfile(rng.uniform(0.1, 2), rng.uniform(0.1, 4), rng.randrange(1, 10) * 10**8,
                         rng.randrange(0, 10) * 5 * 10**7) for _ in range(n)]


def _ranges(plan) -> list[tuple[int, int]]:
    return [(min(s.nodes), max(s.nodes) + 1) for s in plan.stages]


def test_residual_block_down_sets_and_cuts():
    # x -> c1 -> c2 -> add <- x (a skip edge), add -> out
    p = BlockProfile(1.0, 1.0, 100, 0)
    graph = LayerGraph(("x", "c1", "c2", "add", "out"), ((), (0,), (1,), (2, 0), (3,)), (p,) * 5,
                       inputs=frozenset({0}))
    states = graph.down_sets()
    assert [members(m) for m in states] == [[0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert graph.cut(states[0]) == [0, 1]  # the skip tensor x crosses with c1's output
    assert graph.antichain(states[0]) == [1]
    assert graph.boundary_bytes(states[1]) == 200
    assert graph.cut(states[2]) == [3]


def test_a_fork_has_the_exact_cut_not_pipedreams_augmented_one():
    p = BlockProfile(1.0, 1.0, 100, 0)
    graph = LayerGraph(("p", "b1", "b2", "join"), ((), (0,), (0,), (1, 2)), (p,) * 4)
    both = 0b0111
    assert graph.cut(both) == [1, 2]  # PipeDream's augmentation would add p as well (notes C1)
    assert sorted(members(m) for m in graph.down_sets()) == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 2]]


@pytest.mark.parametrize("seed", range(40))
def test_on_chains_the_plan_is_pipedreams(seed):
    rng = random.Random(seed)
    n, workers = rng.randrange(1, 8), rng.randrange(1, 6)
    profiles = _profiles(rng, n)
    bandwidth = rng.choice([1e8, 1e9, 1e10])
    graph = LayerGraph.chain(profiles)
    max_stages = rng.choice([None, 1, 2, 3])
    ours = antichain_partition(graph, Hardware.uniform(workers, bandwidth), max_stages=max_stages)
    theirs = pipedream_partition(profiles, workers, bandwidth, max_stages=max_stages)
    assert _ranges(ours) == theirs.ranges and ours.replicas == theirs.replicas
    assert ours.slowest_s == pytest.approx(theirs.slowest_s, rel=1e-12)
    if workers <= n:
        straight = antichain_partition(graph, Hardware.uniform(workers, bandwidth), replicate=False)
        assert _ranges(straight) == straight_partition(profiles, workers, bandwidth).ranges


def _brute_force(graph: LayerGraph, hardware: Hardware, replicate: bool = True) -> float:
    """The smallest slowest stage over every chain of down-sets and every assignment of all ranks to its stages."""
    states = graph.down_sets()
    best = float("inf")

    def chains(current: int):
        if current == graph.full:
            yield []
            return
        for mask in states:
            if mask & current == current and mask != current:
                for rest in chains(mask):
                    yield [mask, *rest]

    for chain in chains(0):
        s = len(chain)
        if s > hardware.workers:
            continue
        sizes_options = [c for c in itertools.product(range(1, hardware.workers + 1), repeat=s)
                         if sum(c) == hardware.workers and (replicate or set(c) == {1})]
        for order in set(itertools.permutations(range(hardware.workers))):
            for sizes in sizes_options:
                groups, start = [], 0
                for size in sizes:
                    groups.append(order[start:start + size])
                    start += size
                best = min(best, predict(graph, hardware, chain, groups).slowest_s)
    return best


def _hardware(rng: random.Random, workers: int, kind: str) -> Hardware:
    if kind == "uniform":
        return Hardware.uniform(workers, 1e9)
    speeds = tuple(rng.choice([0.5, 1.0, 2.0]) for _ in range(workers))
    if kind == "speeds":
        return Hardware(speeds, tuple((1e9,) * workers for _ in range(workers)))
    links = [[0.0] * workers for _ in range(workers)]
    for a, b in itertools.combinations(range(workers), 2):
        links[a][b] = links[b][a] = rng.choice([2e8, 1e9, 5e9])
    return Hardware(speeds, tuple(tuple(row) for row in links))


@pytest.mark.parametrize("kind", ["uniform", "speeds", "links"])
@pytest.mark.parametrize("seed", range(12))
def test_on_small_random_dags_the_dp_is_optimal(seed, kind):
    rng = random.Random(1000 + seed)
    graph = random_dag(rng.randrange(2, 7), rng)
    hardware = _hardware(rng, rng.randrange(1, 4), kind)
    plan = antichain_partition(graph, hardware)
    assert plan.slowest_s == pytest.approx(_brute_force(graph, hardware), rel=1e-9)
    assert sorted(r for s in plan.stages for r in s.ranks) == list(range(hardware.workers))
    assert sorted(n for s in plan.stages for n in s.nodes) == list(range(graph.size))
    # the plan's own cost is what the DP claimed
    prefixes = list(itertools.accumulate((sum(1 << n for n in s.nodes) for s in plan.stages), lambda a, b: a | b))
    again = predict(graph, hardware, prefixes, [s.ranks for s in plan.stages])
    assert again.slowest_s == pytest.approx(plan.slowest_s, rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_one_rank_per_stage_is_optimal_too(seed):
    rng = random.Random(2000 + seed)
    graph = random_dag(rng.randrange(3, 7), rng)
    hardware = _hardware(rng, 2, "links")
    plan = antichain_partition(graph, hardware, replicate=False)
    assert plan.replicas == [1, 1]
    assert plan.slowest_s == pytest.approx(_brute_force(graph, hardware, replicate=False), rel=1e-9)


def test_a_slower_rank_gets_less_work():
    profiles = [BlockProfile(1.0, 1.0, 1, 0) for _ in range(6)]
    graph = LayerGraph.chain(profiles)
    plan = antichain_partition(graph, Hardware((1.0, 0.5), ((1e12, 1e12), (1e12, 1e12))), replicate=False)
    work = {s.ranks[0]: len(s.nodes) for s in plan.stages}
    assert work == {0: 4, 1: 2}
    assert plan.slowest_s == pytest.approx(8.0)
