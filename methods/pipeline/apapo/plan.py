"""APapo's partition as a plan object: each stage's down-set of the layer graph, the ranks of each stage, what
partition.json records (why the DP chose it), and how every rank comes to hold rank 0's plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.comm.communicator import Communicator
from methods.pipeline.apapo import antichain
from methods.pipeline.apapo.graph import LayerGraph


@dataclass
class LayerPlan:
    """prefixes[s]: the nodes of stages 0..s as a bit mask over the layer graph (nested down-sets); groups[s]: the
    ranks that run stage s, in their replica order; record: what partition.json says about the plan (rank 0)."""

    prefixes: list[int]
    groups: tuple[tuple[int, ...], ...]
    record: dict[str, Any] = field(default_factory=dict)

    def to_tensor(self, nodes: int, workers: int) -> torch.Tensor:
        """[S, each node's stage, each rank's stage, each rank's place in its stage's group], int64."""
        packed = torch.zeros(1 + nodes + 2 * workers, dtype=torch.int64)
        if not self.prefixes:  # no plan (nothing fits the memory budget): S = 0 tells every rank
            return packed
        packed[0] = len(self.prefixes)
        for i in range(nodes):
            packed[1 + i] = next(s for s, mask in enumerate(self.prefixes) if mask >> i & 1)
        for s, group in enumerate(self.groups):
            for place, r in enumerate(group):
                packed[1 + nodes + r], packed[1 + nodes + workers + r] = s, place
        return packed

    @classmethod
    def from_tensor(cls, packed: torch.Tensor, nodes: int, workers: int, record: dict[str, Any] | None = None
                    ) -> LayerPlan:
        stages = int(packed[0])
        node_stage = packed[1:1 + nodes].tolist()
        prefixes = [sum(1 << i for i in range(nodes) if node_stage[i] <= s) for s in range(stages)]
        rank_stage = packed[1 + nodes:1 + nodes + workers].tolist()
        rank_place = packed[1 + nodes + workers:].tolist()
        groups = tuple(tuple(sorted((r for r in range(workers) if rank_stage[r] == s), key=rank_place.__getitem__))
                       for s in range(stages))
        return cls(prefixes, groups, record or {})


def agree(solved: LayerPlan | None, nodes: int, workers: int, comm: Communicator | None) -> LayerPlan:
    """Every rank's copy of rank 0's plan (`solved` there, None elsewhere; `comm` None: one process). Rank 0 gets
    its plan back through the same packing, so every rank holds the same prefixes and groups."""
    packed = solved.to_tensor(nodes, workers) if solved is not None else torch.zeros(1 + nodes + 2 * workers,
                                                                                    dtype=torch.int64)
    if comm is not None:
        comm.broadcast(packed, 0, "control")
    return LayerPlan.from_tensor(packed, nodes, workers, solved.record if solved is not None else None)


def why(graph: LayerGraph, hardware: antichain.Hardware, workers: int, plan: antichain.GraphPlan, params: Any
        ) -> dict[str, Any]:
    """Why the DP chose its plan: its predicted time per microbatch beside the best plan of one rank per stage and
    plain data parallelism (every layer on every rank), on the same profile and hardware (`params`: APapo's)."""
    pipeline = antichain.antichain_partition(graph, hardware, params.stages, False) if workers > 1 else plan
    replicated = antichain.predict(graph, hardware, [graph.full], [tuple(range(workers))])
    kind = ("data parallel" if len(plan.stages) == 1 and workers > 1 else
            "pipeline, one rank per stage" if all(len(s.ranks) == 1 for s in plan.stages) else
            "pipeline with replicated stages")
    return {"chosen": kind, "stages": len(plan.stages), "replicas": plan.replicas, "predicted_s": plan.slowest_s,
            "one_rank_per_stage_s": pipeline.slowest_s, "data_parallel_s": replicated.slowest_s,
            "deterministic": params.profile == "counted" and (
                "snapped measurements" if "measured" in (params.rank_speeds, params.bandwidth) else True)}
