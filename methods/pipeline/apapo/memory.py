"""APapo's planner memory: every layer's saved activations on a microbatch (node by node, as the layer graph was
profiled), and a down-set stage's bytes per replica priced by the pipeline's StageCost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from harness.memory import SavedTensors, saved_bytes
from methods.pipeline.apapo.antichain import GraphPlan, Hardware, antichain_partition, predict
from methods.pipeline.apapo.graph import LayerGraph, members
from methods.pipeline.apapo.layers import TracedModel, call_node, node_inputs
from methods.pipeline.core.memory import StageCost
from methods.pipeline.core.plan_memory import verdict


@dataclass(frozen=True)
class NodeSaved:
    """What autograd keeps of one layer for its backward: its own bytes (besides its inputs and weights), the nodes
    whose outputs it keeps, whether it keeps its own output, and its output's bytes."""

    own: int
    inputs: frozenset[int]
    keeps_output: bool
    output_bytes: int = 0


def node_saved(traced: TracedModel, example: torch.Tensor, loss_fn, targets: torch.Tensor) -> list[NodeSaved]:
    """Every node's NodeSaved on `example`, then the loss's (on the model's output node), one forward each (buffers
    and the RNG as they were)."""
    module, nodes = traced.module, traced.nodes
    index = {n: i for i, n in enumerate(nodes)}
    values: dict[fx.Node, torch.Tensor] = {}
    out: list[NodeSaved] = []
    buffers = [b.detach().clone() for b in module.buffers()]
    devices = [example.device.index or 0] if example.is_cuda else []
    counters: list[SavedTensors] = []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            for node in nodes:
                if node.op == "placeholder":
                    values[node] = example.detach()
                    out.append(NodeSaved(0, frozenset(), False, saved_bytes(example)))
                    continue
                args, kwargs, _, read = node_inputs(module, node, values)
                entries = {t.untyped_storage().data_ptr(): index[p] for p, t in
                           zip(node.all_input_nodes, read, strict=False)}
                counter = SavedTensors(exclude=set(entries) | {p.untyped_storage().data_ptr() for p in read})
                counters.append(counter)
                with counter:
                    value = call_node(module, node, args, kwargs)
                kept = value.untyped_storage().data_ptr() in counter.keys()
                out.append(NodeSaved(counter.peak, frozenset(entries[k] for k in counter.touched if k in entries),
                                     kept, saved_bytes(value)))
                values[node] = value.detach()
            y = values[nodes[traced.output]].detach().requires_grad_(True)
            counter = SavedTensors(exclude={y.untyped_storage().data_ptr()})
            counters.append(counter)
            with counter:
                loss_fn(y, targets)
            out.append(NodeSaved(counter.peak, frozenset({traced.output}) if counter.touched else frozenset(), False))
    finally:
        for counter in counters:  # the profile's graph never runs backward: let it go (SavedTensors.drop)
            counter.drop()
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), buffers, strict=True):
                buffer.copy_(value)
    return out


class GraphMemory:
    """Bytes per replica of the stage `states[j]` minus `states[k]` (k = -1: from the input) with `after` stages
    after it: its layers' parameters and saved activations (the loss's too on the last stage), priced by `cost`."""

    def __init__(self, cost: StageCost, graph: LayerGraph, saved: list[NodeSaved]):
        self.cost, self.graph, self.saved = cost, graph, saved
        self.output_bytes = [node.output_bytes for node in saved]  # each node's output bytes on the microbatch

    def saved_bytes(self, mask: int, last: bool) -> int:
        nodes = members(mask)
        chosen = [*nodes, len(self.saved) - 1] if last else nodes
        total = sum(self.saved[i].own for i in chosen)
        inside = set(nodes)
        held = {p for i in chosen for p in self.saved[i].inputs}
        return total + sum(self.output_bytes[p] for p in held if not (p in inside and self.saved[p].keeps_output))

    def __call__(self, mask: int, replicas: int, after: int, alone: bool) -> int:
        params = sum(self.graph.profiles[i].param_bytes for i in members(mask))
        return self.cost.bytes(params, self.saved_bytes(mask, after == 0), replicas, after, alone)


def stage_bytes(plan: GraphPlan, memory: GraphMemory) -> list[int]:
    """Each stage's bytes per replica in a plan."""
    count = len(plan.stages)
    return [memory(sum(1 << i for i in st.nodes), st.replicas, count - 1 - s, count == 1)
            for s, st in enumerate(plan.stages)]


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
