"""PipeDream's augmented-antichain DP over a layer graph, matched to the hardware: stages of down-set differences,
each on a group of ranks (replicated where it pays), with every rank's compute speed and every link's bandwidth."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from methods.pipeline.apapo.graph import LayerGraph, members
from methods.pipeline.core.partitioner import NoPlanFits, stage_time, sync_time, transfer_time

_TIE_TOLERANCE = 1e-9  # as in partitioner.py: closer objective values are a tie, decided by the enumeration order
MAX_ORDERS = 720  # rank orders tried at most (6 distinct ranks)


@dataclass(frozen=True)
class Hardware:
    """speeds[r]: rank r's compute speed relative to the rank that profiled the layers (a stage's compute time on r is
    its profiled time / speeds[r]); bandwidth[a][b]: bytes/s from rank a to rank b (the diagonal is unused)."""

    speeds: tuple[float, ...]
    bandwidth: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        w = len(self.speeds)
        if w < 1 or any(not s > 0 for s in self.speeds):
            raise ValueError(f"rank speeds must be positive, got {self.speeds}")
        if len(self.bandwidth) != w or any(len(row) != w for row in self.bandwidth):
            raise ValueError(f"bandwidth must be a {w}x{w} matrix (one row and column per rank)")
        if any(not self.bandwidth[a][b] > 0 for a in range(w) for b in range(w) if a != b):
            raise ValueError("every link's bandwidth must be positive (bytes/s)")

    @classmethod
    def uniform(cls, workers: int, bandwidth: float = 1e9) -> Hardware:
        """Equal ranks on equal links: the set-up PipeDream's partitioner assumes."""
        return cls((1.0,) * workers, tuple((bandwidth,) * workers for _ in range(workers)))

    @property
    def workers(self) -> int:
        return len(self.speeds)

    @property
    def uniform_links(self) -> bool:
        values = {self.bandwidth[a][b] for a in range(self.workers) for b in range(self.workers) if a != b}
        return len(values) <= 1

    def link(self, senders: Sequence[int], receivers: Sequence[int]) -> float:
        """The slowest link a message from one group to the other may take."""
        return min(min(self.bandwidth[a][b], self.bandwidth[b][a]) for a in senders for b in receivers)

    def within(self, group: Sequence[int]) -> float:
        """The slowest link inside a group of replicas (inf for one rank: nothing to synchronise)."""
        return min((self.link([a], [b]) for a, b in itertools.combinations(group, 2)), default=math.inf)

    def permuted(self, order: Sequence[int]) -> Hardware:
        return Hardware(tuple(self.speeds[r] for r in order),
                        tuple(tuple(self.bandwidth[a][b] for b in order) for a in order))


@dataclass(frozen=True)
class GraphStage:
    """One stage: the nodes it computes (a down-set minus the previous one), the ranks holding its replicas, and the
    cost model's terms: compute_s (profiled forward + backward of its nodes), predicted_s = max(compute_s / the
    slowest replica's speed, sync_s) / replicas, sync_s = 4 (r-1) |w| / (B r) over the group's slowest link, and
    transfer_s = 2 C / B for the boundary it receives (C bytes over the slowest link from the previous stage)."""

    nodes: tuple[int, ...]
    ranks: tuple[int, ...]
    inputs: tuple[int, ...]  # the nodes whose outputs it receives (the previous down-set's cut)
    compute_s: float
    predicted_s: float
    sync_s: float
    transfer_s: float

    @property
    def replicas(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class GraphPlan:
    """A pipeline over the layer graph: its stages in order and the objective, slowest_s = the largest stage time or
    boundary transfer (PipeDream's time per minibatch). `states` is how many down-sets the DP visited."""

    stages: tuple[GraphStage, ...]
    slowest_s: float
    states: int = 0

    @property
    def replicas(self) -> list[int]:
        return [s.replicas for s in self.stages]

    def node_stage(self, size: int) -> list[int]:
        """stage of every node, by node index."""
        out = [-1] * size
        for index, stage in enumerate(self.stages):
            for node in stage.nodes:
                out[node] = index
        return out

    def to_dict(self, graph: LayerGraph | None = None) -> dict:
        rows = []
        for stage in self.stages:
            row = asdict(stage)
            if graph is not None:
                row["node_names"] = [graph.names[i] for i in stage.nodes]
                row["input_names"] = [graph.names[i] for i in stage.inputs]
            rows.append(row)
        return {"slowest_s": self.slowest_s, "states": self.states, "stages": rows}


def predict(graph: LayerGraph, hardware: Hardware, prefixes: Sequence[int], groups: Sequence[Sequence[int]]
            ) -> GraphPlan:
    """The cost model for a given plan: stage s computes prefixes[s] minus prefixes[s-1] (down-sets, growing, the
    last the whole graph) on ranks groups[s]."""
    if len(prefixes) != len(groups) or not prefixes or prefixes[-1] != graph.full:
        raise ValueError("give one rank group per stage, and down-sets ending with the whole graph")
    stages, previous, previous_group = [], 0, None
    for mask, group in zip(prefixes, groups, strict=True):
        if mask & previous != previous or mask == previous or not graph.is_down_set(mask):
            raise ValueError("stage prefixes must be growing down-sets")
        nodes = members(mask & ~previous)
        compute = math.fsum(graph.profiles[i].compute_s for i in nodes)
        params = sum(graph.profiles[i].param_bytes for i in nodes)
        speed = min(hardware.speeds[r] for r in group)
        within = hardware.within(group)
        transfer = 0.0 if previous_group is None else transfer_time(graph.boundary_bytes(previous),
                                                                    hardware.link(previous_group, group))
        stages.append(GraphStage(tuple(nodes), tuple(group), tuple(graph.cut(previous)) if previous else (),
                                 compute, stage_time(compute / speed, params, len(group), within),
                                 sync_time(params, len(group), within) if len(group) > 1 else 0.0, transfer))
        previous, previous_group = mask, group
    return GraphPlan(tuple(stages), max(max(s.predicted_s, s.transfer_s) for s in stages))


#: A stage's bytes per replica: (the down-set before it, 0 for none; the down-set it completes, both as masks;
#: replicas; stages after it). The stage computes the second minus the first.
StageBytes = Callable[[int, int, int, int], int]


def antichain_partition(graph: LayerGraph, hardware: Hardware, max_stages: int | None = None,
                        replicate: bool = True, memory: StageBytes | None = None,
                        budget: int | None = None) -> GraphPlan:
    """The pipeline over `graph` on all of `hardware`'s ranks with the smallest slowest stage.

    PipeDream's DP (Narayanan et al., SOSP 2019, section 3.1, over its antichain DAG, notes C2-C4), with states the
    down-sets of the layer graph, each keyed by its antichain; a stage is the difference of two nested down-sets
    (only those: pitfall 1), its input the earlier one's exact cut (pitfall 2), and the boundary transfers are part
    of the objective (pitfall 3). On ranks 0..m-1 of a rank order:

        A(j, m) = min( T(D_j, ranks 0..m-1),
                       min_{D_k ⊂ D_j} min_{1 <= m' < m} max( A(k, m-m'), 2 C(D_k) / B_link, T(D_j \\ D_k, m') ) )

    with T(nodes, G) = max( sum_l T_l / min_{g in G} speed_g, 4 (r-1) sum_l |w_l| / (B_G r) ) / r for the r ranks G
    (the last m' of the m), B_G the slowest link inside G, C(D) the bytes of D's cut, and B_link the slowest link
    between the previous stage's ranks and these. With equal links B_link does not depend on the previous stage and
    the recurrence is exactly PipeDream's (a chain gives pipedream_partition's plan, ties included); with unequal
    links the state also carries the last stage's replica count, so the link term is exact. Every rank is used, as in
    PipeDream; `replicate=False` gives one rank per stage (then exactly `workers` stages: straight_partition's plan
    on a chain). `max_stages` caps the stage count. With unequal ranks the DP runs for every rank order that differs
    (ranks with the same speed and links are interchangeable) and keeps the best, the identity order on ties.
    With `memory` and `budget`, a stage whose bytes per replica exceed the budget is infeasible (the state also
    carries the number of stages after the prefix, on which a stage's held microbatches and versions depend); when
    no plan fits, NoPlanFits.
    """
    if max_stages is not None and max_stages < 1:
        raise ValueError(f"max_stages must be >= 1 or None, got {max_stages}")
    states = graph.down_sets()
    if not replicate and hardware.workers > len(states):
        raise ValueError(f"{hardware.workers} stages of one rank each need at least as many down-sets; the graph "
                         f"has {len(states)}")
    best: tuple[float, tuple] | None = None
    for order in _orders(hardware):
        found = _solve(graph, states, hardware.permuted(order), max_stages, replicate, memory, budget)
        if found is not None and (best is None or _better(found[0], best[0])):
            best = (found[0], tuple((mask, tuple(order[i] for i in group)) for mask, group in found[1]))
    if best is None and memory is not None and budget is not None:
        raise NoPlanFits(f"no plan of the layer graph on {hardware.workers} ranks fits {budget} bytes per rank")
    if best is None:
        raise ValueError(f"no pipeline of at most {max_stages} stages uses all {hardware.workers} ranks "
                         f"one per stage" if not replicate else "no plan found")
    plan = predict(graph, hardware, [mask for mask, _ in best[1]], [group for _, group in best[1]])
    return GraphPlan(plan.stages, plan.slowest_s, len(states))


def _orders(hardware: Hardware) -> list[tuple[int, ...]]:
    """Rank orders that differ in what the DP sees (speeds and links), identity first."""
    out, seen = [], set()
    for order in itertools.permutations(range(hardware.workers)):
        view = hardware.permuted(order)
        signature = (view.speeds, view.bandwidth)
        if signature not in seen:
            seen.add(signature)
            out.append(order)
            if len(out) > MAX_ORDERS:
                raise ValueError(f"more than {MAX_ORDERS} distinct rank orders: too many unequal ranks to search")
    return out


_Found = tuple[float, tuple[tuple[int, tuple[int, ...]], ...]]  # (slowest, ((down-set, ranks in order), ...))


def _solve(graph: LayerGraph, states: list[int], hardware: Hardware, max_stages: int | None,
           replicate: bool, memory: StageBytes | None = None, budget: int | None = None) -> _Found | None:
    """The DP on ranks in the order 0..W-1 (stages take consecutive ranks); `after`: the stages after the prefix
    (always 0 without a budget)."""
    limited = memory is not None and budget is not None

    def fits(k: int, j: int, count: int, after: int) -> bool:
        return not limited or memory(states[k] if k >= 0 else 0, states[j], count, after) <= budget

    count, workers = len(states), hardware.workers
    compute = [math.fsum(graph.profiles[i].compute_s for i in members(m)) for m in states]
    params = [sum(graph.profiles[i].param_bytes for i in members(m)) for m in states]
    cut_bytes = [graph.boundary_bytes(m) for m in states]
    ancestors = [[k for k in range(j) if states[k] & ~states[j] == 0] for j in range(count)]
    uniform = hardware.uniform_links

    @functools.cache
    def one_stage(k: int, j: int, low: int, high: int) -> float:
        """Down-set j minus k (k = -1: nothing) on ranks low..high-1."""
        group = range(low, high)
        work = compute[j] - (compute[k] if k >= 0 else 0.0)
        weights = params[j] - (params[k] if k >= 0 else 0)
        return stage_time(work / min(hardware.speeds[r] for r in group), weights, high - low,
                          hardware.within(group))

    def boundary(k: int, senders: range, receivers: range) -> float:
        return transfer_time(cut_bytes[k], hardware.link(senders, receivers))

    def solution(prefix: _Found | None, value: float, k: int, j: int, low: int, high: int) -> _Found:
        tail = ((states[j], tuple(range(low, high))),)
        return (value, (*prefix[1], *tail) if prefix else tail)

    @functools.cache
    def best(j: int, m: int, left: int | None, last: int | None, after: int = 0) -> _Found | None:
        """The best plan of down-set j on ranks 0..m-1 with at most `left` stages, `after` stages following it;
        `last`: the last stage's rank count (None: any; used with equal links, where the boundary does not depend
        on it)."""
        incumbent: _Found | None = None
        if (last is None or last == m) and (replicate or m == 1) and fits(-1, j, m, after):
            incumbent = solution(None, one_stage(-1, j, 0, m), -1, j, 0, m)
        if left == 1 or last == m:
            return incumbent
        below = None if left is None else left - 1
        lasts = [last] if last is not None else range(1, m if replicate else min(m, 2))
        for k in ancestors[j]:
            for tail in lasts:
                if not replicate and tail != 1:
                    continue
                start = m - tail
                if not fits(k, j, tail, after):
                    continue
                stage = one_stage(k, j, start, m)
                nxt = after + 1 if limited else 0
                prefixes = [(None, best(k, start, below, None, nxt))] if uniform else \
                    [(r, best(k, start, below, r, nxt)) for r in range(1, start + 1)]
                for r, prefix in prefixes:
                    if prefix is None:
                        continue
                    senders = range(start - r, start) if r is not None else range(start - 1, start)
                    value = max(prefix[0], boundary(k, senders, range(start, m)), stage)
                    if incumbent is None or _better(value, incumbent[0]):
                        incumbent = solution(prefix, value, k, j, start, m)
        return incumbent

    if uniform:
        return best(count - 1, workers, max_stages, None)
    found = None
    for last in [workers, *range(1, workers)]:
        candidate = best(count - 1, workers, max_stages, last)
        if candidate is not None and (found is None or _better(candidate[0], found[0])):
            found = candidate
    return found


def _better(value: float, incumbent: float) -> bool:
    return value < incumbent - _TIE_TOLERANCE * abs(incumbent)
