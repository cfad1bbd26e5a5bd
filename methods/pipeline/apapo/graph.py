"""A model as a DAG of layers for partitioning: nodes with profiles, their down-sets (the antichain DP's states) and
the tensors that cross each down-set's boundary."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from methods.pipeline.core.block_profile import BlockProfile

#: More down-sets than this and the DP would be slow: coarsen the graph (merge chains) first.
MAX_STATES = 20_000


@dataclass(frozen=True)
class LayerGraph:
    """Nodes 0..n-1 in a topological order: preds[i] are node i's direct predecessors (all < i); profiles[i] its
    forward and backward time, the bytes of its output (activation_bytes) and of its parameters. `inputs` are the
    model's input placeholders: they belong to the first stage and never make a stage on their own.

    A set of nodes is a bitmask (bit i = node i). A *down-set* D holds every predecessor of its members: the nodes a
    pipeline prefix has computed. Its *antichain* is its maximal members (PipeDream's state key); its *boundary*
    (`cut`) the members whose output some node outside D consumes: the tensors the next stage receives. PipeDream's
    "augmented antichain" approximates the boundary (it also adds ancestors feeding two members, notes C1); the exact
    cut is used here.
    """

    names: tuple[str, ...]
    preds: tuple[tuple[int, ...], ...]
    profiles: tuple[BlockProfile, ...]
    inputs: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        n = len(self.names)
        if not n or len(self.preds) != n or len(self.profiles) != n:
            raise ValueError(f"a layer graph needs as many names, predecessor lists and profiles as nodes "
                             f"({len(self.names)}, {len(self.preds)}, {len(self.profiles)})")
        for i, ps in enumerate(self.preds):
            if any(not 0 <= p < i for p in ps):
                raise ValueError(f"node {i} ({self.names[i]}): predecessors {ps} must come before it")

    @classmethod
    def chain(cls, profiles: Sequence[BlockProfile]) -> LayerGraph:
        """Blocks in a line (block i feeds block i+1): the graph PipeDream's contiguous partitioner assumes."""
        return cls(tuple(f"block{i}" for i in range(len(profiles))),
                   tuple(() if i == 0 else (i - 1,) for i in range(len(profiles))), tuple(profiles))

    @property
    def size(self) -> int:
        return len(self.names)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.names]
        for i, ps in enumerate(self.preds):
            for p in ps:
                out[p].append(i)
        return tuple(tuple(s) for s in out)

    @cached_property
    def full(self) -> int:
        return (1 << self.size) - 1

    @cached_property
    def _pred_masks(self) -> tuple[int, ...]:
        return tuple(sum(1 << p for p in ps) for ps in self.preds)

    @cached_property
    def _succ_masks(self) -> tuple[int, ...]:
        return tuple(sum(1 << s for s in ss) for ss in self.succs)

    @cached_property
    def _input_mask(self) -> int:
        return sum(1 << i for i in self.inputs)

    def is_down_set(self, mask: int) -> bool:
        return all(self._pred_masks[i] & ~mask == 0 for i in members(mask))

    def down_sets(self, limit: int = MAX_STATES) -> list[int]:
        """Every down-set that is a possible pipeline prefix (non-empty, not inputs alone), smallest first, ties in
        the order of their sorted members: the antichain DP's states. The last is the whole graph. A chain of n
        nodes has n: its prefixes."""
        seen, frontier = {0}, [0]
        while frontier:
            grown = []
            for mask in frontier:
                for i in range(self.size):
                    if not mask >> i & 1 and self._pred_masks[i] & ~mask == 0:
                        bigger = mask | 1 << i
                        if bigger not in seen:
                            seen.add(bigger)
                            grown.append(bigger)
                            if len(seen) > limit:
                                raise ValueError(f"the layer graph has more than {limit} down-sets: too wide for "
                                                 f"the antichain DP; merge chains or partition coarser blocks")
            frontier = grown
        states = [m for m in seen if m and m & ~self._input_mask]
        return sorted(states, key=lambda m: (m.bit_count(), members(m)))

    def cut(self, mask: int) -> list[int]:
        """The boundary of down-set `mask`: its members consumed by a node outside it, in node order."""
        return [i for i in members(mask) if self._succ_masks[i] & ~mask]

    def antichain(self, mask: int) -> list[int]:
        """The maximal members of `mask` (no successor inside it)."""
        return [i for i in members(mask) if not self._succ_masks[i] & mask]

    def boundary_bytes(self, mask: int) -> int:
        """Bytes crossing the boundary of `mask` in one direction: the sum of its cut's output activations."""
        return sum(self.profiles[i].activation_bytes for i in self.cut(mask))

    def topological_prefix(self, count: int) -> int:
        """The first `count` nodes (a prefix of a topological order is a down-set)."""
        return (1 << count) - 1


def members(mask: int) -> list[int]:
    """The node indices in bitmask `mask`, ascending."""
    out, i = [], 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


def random_dag(nodes: int, rng: random.Random, edge_probability: float = 0.35) -> LayerGraph:
    """A random connected DAG with one source (node 0) and random profiles, for tests: node i > 0 takes 1 to 3 of the
    earlier nodes as predecessors (always at least one), and every sink but the last feeds the last node."""
    preds: list[tuple[int, ...]] = [()]
    for i in range(1, nodes):
        chosen = {rng.randrange(i)} | {p for p in range(i) if rng.random() < edge_probability / i * 3}
        preds.append(tuple(sorted(chosen))[:3])
    consumed = {p for ps in preds for p in ps}
    last = sorted(set(preds[-1]) | {i for i in range(nodes - 1) if i not in consumed})
    preds[-1] = tuple(last)
    profiles = tuple(BlockProfile(rng.uniform(0.1, 2.0), rng.uniform(0.1, 4.0), rng.randrange(1, 10) * 100_000_000,
                                  rng.randrange(0, 10) * 50_000_000) for _ in range(nodes))
    return LayerGraph(tuple(f"n{i}" for i in range(nodes)), tuple(preds), profiles)
