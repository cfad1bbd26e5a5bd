"""A model at layer level through torch.fx: its layer graph with per-node profiles, and the stage modules a graph
plan cuts it into, which pass several tensors across a boundary as one flat payload."""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from harness.models.gpt import CausalSelfAttention, Embeddings
from methods.pipeline.apapo.graph import LayerGraph, members
from methods.pipeline.core.block_profile import BlockProfile


@dataclass
class TracedModel:
    """A model traced by torch.fx at layer level (torch's leaf modules, e.g. Conv2d, GroupNorm, Linear, and the
    functions between them, e.g. add, relu, slicing) with each node's profile: nodes[i] is node i of `graph`
    (node 0 the input placeholder), shapes[i] the per-sample shape of its output, `output` the node the model
    returns."""

    module: fx.GraphModule
    nodes: list[fx.Node]
    graph: LayerGraph
    shapes: list[tuple[int, ...]]
    output: int


#: Modules traced as one layer although torch.fx could look inside: their insides compute shapes and positions
#: rather than batches (the GPT's embeddings and attention). APapo's choice, kept here, not in the models.
WHOLE_LAYERS: tuple[type[nn.Module], ...] = (Embeddings, CausalSelfAttention)


class LayerTracer(fx.Tracer):
    """torch.fx's tracer, with one more kind of leaf: a module of a WHOLE_LAYERS class, or of a plug-in class that
    sets `traced_as_layer = True`, is one layer."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (isinstance(m, WHOLE_LAYERS) or getattr(m, "traced_as_layer", False)
                or super().is_leaf_module(m, module_qualified_name))


def symbolic_trace(model: nn.Module) -> fx.GraphModule:
    """`model` traced at layer level by LayerTracer."""
    return fx.GraphModule(model, LayerTracer().trace(model))


def layer_count(model: nn.Module) -> int:
    """The nodes of `model`'s layer graph besides the input (what `trace` profiles), from torch.fx's symbolic trace
    alone: nothing runs, so a model on the meta device will do."""
    return sum(1 for n in symbolic_trace(model).graph.nodes if n.op not in ("placeholder", "output"))


#: The nominal rank of a counted profile: a pass costs FLOPs / COUNTED_FLOPS + bytes moved / COUNTED_BYTES + a fixed
#: COUNTED_OVERHEAD_S (twice each for a backward): a CPU core's order of magnitude, where small layers cost mostly
#: their dispatch; the rates weigh compute against the links' bytes/s.
COUNTED_FLOPS = 1e10
COUNTED_BYTES = 1e10
COUNTED_OVERHEAD_S = 1e-5

Profiling = Literal["measured", "counted", "none"]


def trace(model: nn.Module, example: torch.Tensor, profile: bool | Profiling = True, repeats: int = 5,
          warmup: int = 1) -> TracedModel:
    """Trace `model` (one tensor in, one out), run `example` (a microbatch) through it node by node and profile every
    node as profile_blocks profiles a block: forward time, backward time (gradients w.r.t. its tensor inputs and
    its parameters, all-ones output gradient), median of `repeats` after `warmup`; output and parameter bytes.
    `profile` "counted" (deterministic: the same on every machine and run) gives each pass FLOPs / COUNTED_FLOPS
    (torch's FlopCounterMode) + the bytes it reads and writes / COUNTED_BYTES instead of timing it; False or "none"
    gives times of 0 (one forward per node gives the shapes). Parameters, buffers and the RNG are left as they were."""
    mode: Profiling = "measured" if profile is True else "none" if profile is False else profile
    module = symbolic_trace(model)
    nodes = [n for n in module.graph.nodes if n.op != "output"]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1 or nodes[0] is not placeholders[0]:
        raise ValueError("the layer graph needs a model with exactly one input")
    returned = next(n for n in module.graph.nodes if n.op == "output").args[0]
    if not isinstance(returned, fx.Node):
        raise ValueError("the layer graph needs a model that returns one tensor")
    index = {n: i for i, n in enumerate(nodes)}
    preds = tuple(tuple(sorted(index[p] for p in n.all_input_nodes)) for n in nodes)
    saved = [b.detach().clone() for b in module.buffers()]
    profiles, shapes, values = [], [], {}
    with torch.random.fork_rng(devices=[example.device.index or 0] if example.is_cuda else []), torch.enable_grad():
        for node in nodes:
            if node.op == "placeholder":
                out, forward_s, backward_s = example.detach(), 0.0, 0.0
            else:
                if mode == "counted":
                    out, forward_s, backward_s = _count_node(module, node, values)
                else:
                    out, forward_s, backward_s = _profile_node(module, node, values, repeats if mode == "measured"
                                                               else 1, warmup if mode == "measured" else 0)
                if mode == "none":
                    forward_s = backward_s = 0.0
            if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != example.shape[0]:
                raise ValueError(f"layer {node.name} does not return a batch of tensors; the layer graph needs "
                                 f"every node to")
            values[node] = out.detach()
            params = sum(p.numel() * p.element_size() for p in _parameters(module, node))
            profiles.append(BlockProfile(forward_s, backward_s, out.numel() * out.element_size(), params))
            shapes.append(tuple(out.shape[1:]))
    with torch.no_grad():
        for buffer, value in zip(module.buffers(), saved, strict=True):
            buffer.copy_(value)
    graph = LayerGraph(tuple(n.name for n in nodes), preds, tuple(profiles), inputs=frozenset({0}))
    return TracedModel(module, nodes, graph, shapes, index[returned])


def _attribute(module: nn.Module, target: str) -> Any:
    return functools.reduce(getattr, target.split("."), module)


def _parameters(module: fx.GraphModule, node: fx.Node) -> list[nn.Parameter]:
    if node.op == "call_module":
        return list(module.get_submodule(node.target).parameters())
    if node.op == "get_attr":
        value = _attribute(module, node.target)
        return [value] if isinstance(value, nn.Parameter) else []
    return []


def call_node(module: fx.GraphModule, node: fx.Node, args: tuple, kwargs: dict) -> Any:
    if node.op == "call_module":
        return module.get_submodule(node.target)(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    if node.op == "get_attr":
        return _attribute(module, node.target)
    raise ValueError(f"cannot profile fx node {node.name} ({node.op})")


def node_inputs(module: fx.GraphModule, node: fx.Node, values: dict
                 ) -> tuple[tuple, dict, list[torch.Tensor], list[torch.Tensor]]:
    """A node's args and kwargs on fresh leaves of its inputs' values, what its backward differentiates (the
    floating-point inputs and its trainable parameters), and those inputs and parameters."""
    inputs = {p: values[p].detach().requires_grad_(values[p].is_floating_point()) for p in node.all_input_nodes}
    args = fx.node.map_arg(node.args, lambda n: inputs[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: inputs[n])
    params = [p for p in _parameters(module, node) if p.requires_grad]
    read = [*inputs.values(), *params]
    return args, kwargs, [t for t in inputs.values() if t.requires_grad] + params, read


def _profile_node(module: fx.GraphModule, node: fx.Node, values: dict, repeats: int, warmup: int
                  ) -> tuple[torch.Tensor, float, float]:
    args, kwargs, wrt, _ = node_inputs(module, node, values)
    forwards, backwards, out = [], [], None
    for run in range(warmup + repeats):
        start = time.perf_counter()
        out = call_node(module, node, args, kwargs)
        middle = time.perf_counter()
        if isinstance(out, torch.Tensor) and out.requires_grad and wrt:
            torch.autograd.grad(out, wrt, grad_outputs=torch.ones_like(out), allow_unused=True)
        if run >= warmup:
            forwards.append(middle - start)
            backwards.append(time.perf_counter() - middle)
    return out, statistics.median(forwards), statistics.median(backwards)


def _count_node(module: fx.GraphModule, node: fx.Node, values: dict) -> tuple[torch.Tensor, float, float]:
    """A node's forward and backward 'seconds' on the nominal rank: FLOPs / COUNTED_FLOPS + bytes / COUNTED_BYTES +
    COUNTED_OVERHEAD_S (forward: inputs and parameters read, output written; backward: twice the bytes and the
    overhead, reading and writing gradients; none for a node with nothing to differentiate)."""
    args, kwargs, wrt, read = node_inputs(module, node, values)
    with FlopCounterMode(display=False) as forward:
        out = call_node(module, node, args, kwargs)
    backward_flops = 0
    if isinstance(out, torch.Tensor) and out.requires_grad and wrt:
        with FlopCounterMode(display=False) as backward:
            torch.autograd.grad(out, wrt, grad_outputs=torch.ones_like(out), allow_unused=True)
        backward_flops = backward.get_total_flops()
    moved = sum(t.numel() * t.element_size() for t in read)
    moved += out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0
    forward_s = forward.get_total_flops() / COUNTED_FLOPS + moved / COUNTED_BYTES + COUNTED_OVERHEAD_S
    backward_s = backward_flops / COUNTED_FLOPS + 2 * moved / COUNTED_BYTES + 2 * COUNTED_OVERHEAD_S if wrt else 0.0
    return out, forward_s, backward_s


class BoundaryStage(nn.Module):
    """A stage of a layer graph: `body` maps the tensors it receives to the tensors it passes on (a tuple each).

    On the wire a boundary is one tensor per microbatch: a single tensor as it is, several as one flat payload,
    N x sum_i prod(shape_i), their per-sample values concatenated in node order. So the pipeline core (executor,
    codecs, evaluation) carries any boundary unchanged; `in_shapes` and `out_shapes` are the per-sample shapes
    that cut the payload back into tensors.
    """

    def __init__(self, body: fx.GraphModule, in_shapes: Sequence[tuple[int, ...]],
                 out_shapes: Sequence[tuple[int, ...]]):
        super().__init__()
        self.body = body
        self.in_shapes, self.out_shapes = [tuple(s) for s in in_shapes], [tuple(s) for s in out_shapes]

    @property
    def wire_shape(self) -> tuple[int, ...]:
        """The per-sample shape of what this stage sends on."""
        return flat_shape(self.out_shapes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if len(self.in_shapes) == 1:
            args = [x]
        else:
            # Each part is copied out contiguous: a strided, unaligned slice of the payload could send a layer down
            # another BLAS kernel than the whole model takes (MKL's results may depend on operand layout).
            sizes = [math.prod(s) for s in self.in_shapes]
            args = [part.reshape(n, *shape).contiguous()
                    for part, shape in zip(torch.split(x, sizes, dim=1), self.in_shapes, strict=True)]
        outs = self.body(*args)
        if len(self.out_shapes) == 1:
            return outs[0]
        return torch.cat([o.reshape(n, -1) for o in outs], dim=1)


def flat_shape(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The per-sample wire shape of a boundary: the tensor's own shape, or (total elements,) for several."""
    return tuple(shapes[0]) if len(shapes) == 1 else (sum(math.prod(s) for s in shapes),)


def split(traced: TracedModel, prefixes: Sequence[int]) -> list[BoundaryStage]:
    """The stage modules of a plan: stage s computes down-set prefixes[s] minus prefixes[s-1] (growing, the last
    the whole graph); it receives the previous down-set's cut and sends its own (the last stage: the model's
    output). The modules share the traced model's layers (and so its parameters)."""
    graph, stages, previous = traced.graph, [], 0
    for s, mask in enumerate(prefixes):
        receives = graph.cut(previous) if previous else [0]
        sends = graph.cut(mask) if s < len(prefixes) - 1 else [traced.output]
        body, env = fx.Graph(), {}
        for i in receives:
            env[traced.nodes[i]] = body.placeholder(f"in_{traced.nodes[i].name}")
        for i in members(mask & ~previous):
            node = traced.nodes[i]
            if node.op != "placeholder":
                env[node] = body.node_copy(node, env.__getitem__)
        body.output(tuple(env[traced.nodes[i]] for i in sends))
        stages.append(BoundaryStage(fx.GraphModule(traced.module, body),
                                    [traced.shapes[i] for i in receives], [traced.shapes[i] for i in sends]))
        previous = mask
    return stages
