"""APapo's planner memory: a down-set stage's bytes per replica, the stage built and profiled as the run builds its
stages and priced by the runner's own terms and walk."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from harness.memory import Footprint, LossBlock, footprints
from methods.pipeline.apapo.antichain import GraphPlan, Hardware, antichain_partition, predict
from methods.pipeline.apapo.graph import LayerGraph
from methods.pipeline.apapo.layers import TracedModel, split
from methods.pipeline.core.memory import StageWalk, backward_transients
from methods.pipeline.core.plan_memory import verdict
from methods.pipeline.core.step_bytes import StageTerms

#: A candidate stage's terms: (its blocks' footprints and backward transients in a chain, the stage's module, its
#: index in that chain, whether it is the first stage, stages after it, microbatches it holds) -> StageTerms.
GraphTerms = Callable[[list[Footprint], list[int], nn.Module, int, bool, int, int], StageTerms]


class GraphMemory:
    """Bytes per replica of the stage that computes down-set `mask` minus down-set `previous` (0: from the input)
    with `after` stages after it: the stage built as the run builds it (layers.split: it receives `previous`'s cut
    and sends its own), profiled as the runner profiles its stages (footprints and backward_transients on the
    microbatch `example`, in the chain [the prefix, the stage, the rest, the loss]), its terms (`terms`: the
    runner's stage_terms) walked by `walk` (the runner's walk, StageWalk). Each stage is profiled once, each price
    computed once."""

    def __init__(self, walk: StageWalk, traced: TracedModel, example: torch.Tensor, loss: LossBlock,
                 terms: GraphTerms, copied: Callable[[bool, bool], bool] = lambda first, last: False):
        self.walk, self.traced, self.example, self.loss, self.terms = walk, traced, example, loss, terms
        self.copied = copied  # whether a stage (the first? the last?) differentiates a copy of its weights
        self._profiles: dict[tuple[int, int], tuple[list[Footprint], list[int], nn.Module, int]] = {}
        self._prices: dict[tuple[int, int, int, int], int] = {}

    def _profile(self, previous: int, mask: int) -> tuple[list[Footprint], list[int], nn.Module, int]:
        key = (previous, mask)
        if key not in self._profiles:
            full = self.traced.graph.full
            prefixes = [p for p in (previous, mask) if p and p != full] + [full]
            chain = list(split(self.traced, prefixes))
            prints = footprints([*chain, self.loss], self.example, detach_inputs=True)
            index = 1 if previous else 0  # a stage's place fixes its delay: the last (mask = full) or one before
            transients = backward_transients(chain, self.example, self.loss, prints,
                                             copies={index} if self.copied(previous == 0, mask == full) else ())
            self._profiles[key] = (prints, transients, chain[index], index)
        return self._profiles[key]

    def __call__(self, previous: int, mask: int, replicas: int, after: int) -> int:
        key = (previous, mask, replicas, after)
        if key not in self._prices:
            prints, transients, module, index = self._profile(previous, mask)
            terms = self.terms(prints, transients, module, index, previous == 0, after,
                               self.walk.held(replicas, after))
            self._prices[key] = self.walk.bytes(terms, replicas, after).total
        return self._prices[key]


def copied_transients(blocks: list[nn.Module], example: torch.Tensor, loss: nn.Module, prints: list[Footprint],
                      transients: list[int], delays: tuple[int, ...]) -> list[int]:
    """`transients` (one block per stage, then the loss) with each stage of delay D > 0 profiled as its backwards
    run: on a copy of its weights, whose gradients stay until the backward ends while the live weights' .grad
    exists (backward_transients(copies=True); a GPT stage's layer-norm gradients beside its MLP's backward)."""
    if not any(delays):
        return transients
    return backward_transients(blocks, example, loss, prints, copies={s for s, d in enumerate(delays) if d})


def stage_bytes(plan: GraphPlan, memory: GraphMemory) -> list[int]:
    """Each stage's bytes per replica in a plan."""
    count, previous, out = len(plan.stages), 0, []
    for s, st in enumerate(plan.stages):
        mask = previous | sum(1 << i for i in st.nodes)
        out.append(memory(previous, mask, st.replicas, count - 1 - s))
        previous = mask
    return out


def shapes(graph: LayerGraph, hardware: Hardware, workers: int, max_stages: int | None, chosen: GraphPlan | None,
           memory: GraphMemory, budget: int | None) -> list[dict[str, Any]]:
    """Data parallelism over every rank and the fastest pipeline of one rank per stage (the budget aside), each with
    its stages' bytes and why it was not taken, beside the chosen plan."""
    candidates = [("data parallel", predict(graph, hardware, [graph.full], [tuple(range(workers))]))]
    if workers > 1:
        candidates.append(("one rank per stage", antichain_partition(graph, hardware, max_stages, False)))
    rows = []
    for name, plan in candidates:
        need = stage_bytes(plan, memory)
        same = chosen is not None and [s.nodes for s in plan.stages] == [s.nodes for s in chosen.stages] and \
            plan.replicas == chosen.replicas
        why = verdict(need, budget, same, plan.slowest_s, chosen.slowest_s if chosen else None)
        rows.append({"shape": f"{name} ({len(plan.stages)} stages, replicas {plan.replicas})",
                     "replicas": plan.replicas, "predicted_s": plan.slowest_s, "stage_bytes": need, "verdict": why})
    return rows
