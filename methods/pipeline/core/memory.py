"""A pipeline's memory prices, before its first step: a stage's profiled terms (stage_terms, for the runner's walk
of its schedules: core/step_bytes.py), each block's backward transient, what a stage measurably held, and the
planners' StageWalk (a candidate stage's terms walked over the method's steady-state steps, the same walk)."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from harness.memory import (
    Footprint,
    MemoryBytes,
    chain_saved_bytes,
    gradient_bytes,
    planned_optimizer_bytes,
    weight_bytes,
)
from harness.memory.passes import pass_peak
from harness.memory.profile import as_they_were
from harness.memory.update import optimizer_step_temporaries
from harness.schedule.held import in_flight_peaks
from harness.schedule.ir import Op, Schedule
from harness.trace import StepSchedule
from methods.pipeline.core.codecs import Codec, Plain
from methods.pipeline.core.stage import Stage
from methods.pipeline.core.step_bytes import StageTerms, rank_peaks


def stage_terms(prints: list[Footprint], blocks: tuple[int, int], first: bool, last: bool,
                modules: list[nn.Module], optimizer: torch.optim.Optimizer, act: Codec, grad: Codec, batch: int,
                split: bool = False, versions: int = 0, recompute: bool = False,
                transients: list[int] | None = None, retained: list[int] | None = None) -> StageTerms:
    """The one price of a stage, for the runner's plan and the planners alike: blocks [a, b) of a chain profiled
    by `prints` (every block, then the loss) on a full microbatch, as the stage `first`/`last` in the chain, with
    `modules` its blocks and `optimizer` theirs, `act`/`grad` the wire's codecs, `batch` the step's inputs or
    labels it loads, `split` a zero-bubble B/W, `versions` the bytes of the weight versions its policy keeps, and
    `recompute` a backward that recomputes the stage from its input (only the input is kept), `transients` every
    block's backward transient (backward_transients; the stage's is its largest block's, the loss's too on the
    last stage), `retained` what a zero-bubble B keeps for its W, block by block (split_retained; without it, each
    weighted block's output gradient). A first stage whose first block saves its input (a microbatch's view of the
    step's batch) keeps that batch until the microbatch's backward (`kept_batch`: the walk counts it where that
    backward comes in a later step, as APapo's B(tM - 1) and PipeDream's delayed backwards do)."""
    a, b = blocks
    inp = 0 if first else prints[a].input_bytes
    out = 0 if last else prints[b - 1].output_bytes
    if recompute:
        saved = 0
    else:
        saved = chain_saved_bytes(prints, a, b + 1 if last else b)
        if prints[a].saves_input:  # the input's storage is the receive buffer (or the batch): held as that
            saved -= prints[a].input_bytes
        if out and prints[b - 1].saves_output:  # the output's is the send's buffer: held as that
            saved -= out
    kept = 0
    if split and not first and retained is not None:  # B keeps, for W, what each block's B kept
        kept = sum(retained[a:b + 1 if last else b])
    elif split and not first:  # B keeps, for W, the gradient at each weighted block's output
        kept = sum(prints[i].output_bytes for i, m in zip(range(a, b), modules_blocks(modules), strict=False)
                       if any(p.requires_grad for p in m.parameters(recurse=True)))
    return StageTerms(
        weights=weight_bytes(modules), gradients=gradient_bytes(modules),
        optimizer=planned_optimizer_bytes(optimizer), saved=max(0, saved), output=out, input=inp,
        recv_act=_payload(act, inp), recv_grad=_payload(grad, out),
        send_act=0 if isinstance(act, Plain) else _payload(act, out),
        send_grad=0 if isinstance(grad, Plain) else _payload(grad, inp),
        grad_input=inp, retained=kept, batch=batch, update_temps=update_temporaries(optimizer),
        backward_temps=_stage_transient(prints, transients, a, b, last) if transients else 0,
        versions=versions, kept_batch=batch if first and not last and prints[a].saves_input else 0)


@runtime_checkable
class StatesTemporaries(Protocol):
    """An optimizer of the methods' own that states its step's temporaries (SpikeCompensatedSGD)."""

    def step_temporaries(self) -> int: ...


def update_temporaries(optimizer: torch.optim.Optimizer) -> int:
    """The bytes one optimizer step allocates and frees: an optimizer of the methods' own states them
    (StatesTemporaries), torch's are derived from its implementation (harness/memory/update.py)."""
    if isinstance(optimizer, StatesTemporaries):
        return optimizer.step_temporaries()
    return optimizer_step_temporaries(optimizer)


def _stage_transient(prints: list[Footprint], transients: list[int], a: int, b: int, last: bool) -> int:
    """A stage's backward transient: its worst block's (the loss's too on the last stage), each with the gradient of
    the block's output alive beside it (made by the next block's backward, or the loss's; a residual block's
    backward reads it on both branches, so it lives through the block's backward). The stage's last block's is
    the received gradient instead, a buffer of its own (not on the last stage)."""
    out = transients[b] if last else 0
    for k in range(a, b):
        incoming = prints[k].output_bytes if last or k < b - 1 else 0
        out = max(out, transients[k] + incoming)
    return out


def modules_blocks(modules: list[nn.Module]) -> list[nn.Module]:
    """The blocks of a stage's module (an nn.Sequential of them), or the modules given."""
    if len(modules) == 1 and isinstance(modules[0], nn.Sequential):
        return list(modules[0])
    return list(modules)


def _payload(codec: Codec, fp32_bytes: int) -> int:
    """The codec's payload for an fp32 tensor of `fp32_bytes` bytes (0: none)."""
    return codec.nbytes(math.ceil(fp32_bytes / 4)) if fp32_bytes else 0


def held_bytes(stage: Stage) -> MemoryBytes:
    """One stage's measured bytes over the run: each kind at its peak."""
    return MemoryBytes(weights=weight_bytes([stage.module]), gradients=stage.gradient_bytes,
                       optimizer=stage.optimizer_bytes, versions=stage.run_peak.weight_bytes,
                       activations=stage.run_peak.activation_bytes, buffers=stage.run_peak.buffer_bytes)


class StageWalk:
    """How the planners walk a candidate stage before any stage exists: the method's steady-state step (one stage
    per rank) shifted as the next steps' are, 4S + 4 times (as the runner walks its first 4S + 4 steps); a stage
    with `after` stages after it runs the actions of the step's rank S-1-after, a replica of r those of the
    microbatches it owns (mb mod r = 0: the replica that owns the most, Placement.owner) and every update; its
    bytes are the StepBytes walk of those actions with the stage's terms (core/step_bytes.py: the runner's gate's
    own walk), what it holds throughout on top."""

    def __init__(self, step: StepSchedule, lanes: bool = False):
        self.stages, self.lanes = len(step.ranks), lanes
        self.steps = [[[replace(a, mb=None if a.mb is None else a.mb + k * step.shift,
                                iteration=a.iteration + k * step.iteration_shift) for a in actions]
                       for actions in step.ranks] for k in range(4 * self.stages + 4)]
        self._actions: dict[tuple[int, int], tuple[int, list[Schedule]]] = {}

    def actions(self, replicas: int, after: int) -> tuple[int, list[Schedule]]:
        """The stage index the walked actions name and each step's actions of the replica (one worker)."""
        key = (replicas, min(after, self.stages - 1))
        if key not in self._actions:
            position = self.stages - 1 - key[1]
            self._actions[key] = (position, [[[a for a in schedule[position] if a.mb is None
                                               or a.op is Op.SYNC_GRADS or a.mb % replicas == 0]]
                                             for schedule in self.steps])
        return self._actions[key]

    def held(self, replicas: int, after: int) -> int:
        """The most microbatches the replica holds at once (forward run, its backward not yet)."""
        position, steps = self.actions(replicas, after)
        return max(1, in_flight_peaks(steps, self.lanes).get((0, position), 0))

    def bytes(self, terms: StageTerms, replicas: int, after: int) -> MemoryBytes:
        """The replica's plan with `terms`: its worst moment over the walked steps, by kind."""
        position, steps = self.actions(replicas, after)
        return rank_peaks(steps, {(0, position): terms}, self.lanes)[0]


def backward_transients(blocks: list[nn.Module], example: torch.Tensor, loss: nn.Module,
                        prints: list[Footprint], accumulate: bool = True, copies: Collection[int] = ()) -> list[int]:
    """Each block's backward transient on `example` fed through the chain (`loss` last; `prints` their
    footprints): the allocator's peak over one forward and backward of the block alone (harness/memory/passes.py;
    the block's input and the gradient flowing in exist before it) less what the plan counts apart (the block's
    saved tensors, its output, its parameters' gradients): the gradient flowing out and the ops' own gradients and
    workspaces. Profiled twice, the larger kept: as a step's first backward runs (no .grad yet: autograd's
    AccumulateGrad keeps each new gradient as the .grad) and as a later one does (the .grad exists: each new
    gradient is a temporary added into it, alive with the op's workspaces; CPU convolution_backward holds two
    weight-sized buffers then, digits-resnet's 64x64 conv: 2 x 147,456 B). Without `accumulate` (a method whose
    every backward is the first since an update, as PB's one sample per tick) only the first is profiled. For the
    blocks whose chain index is in `copies` (a backward that differentiates a copy of the weights, a stash or a
    weight version, while the live weights' .grad exists: Stage.backward adds the copy's gradients into it once the
    backward is done) the first profile's gradients are temporaries too, alive until the backward ends. A stage's
    backward transient is its largest block's. Buffers (BatchNorm's statistics) and the RNG
    are as they were on return."""
    chain = [*blocks, loss]
    device = example.device
    out: list[int] = []
    with as_they_were(chain, device):
        x = example
        for index, block in enumerate(chain):
            x = x.detach().requires_grad_(x.is_floating_point() and index > 0)
            with torch.no_grad():
                y = block(x)
            grad = torch.ones_like(y) if y.dim() else None

            def one(block: nn.Module = block, x: torch.Tensor = x, grad: torch.Tensor | None = grad) -> None:
                z = block(x)
                if z.requires_grad:  # a block without weights on the model's input has no backward
                    z.backward(grad)
                x.grad = None

            p = prints[index]
            counted = p.saved_bytes + (0 if p.saves_output else p.output_bytes)
            first = pass_peak(one, [block], device) - (0 if index in copies else gradient_bytes([block]))
            later = pass_peak(one, [block], device, accumulate=True) if accumulate else 0
            out.append(max(0, first - counted, later - counted))
            x = y
    return out


def split_retained(blocks: list[nn.Module], example: torch.Tensor, loss: nn.Module) -> list[int]:
    """What a zero-bubble B keeps for its W, for each block of the chain (`loss` last) on `example` fed through it:
    the gradients stage_backward_input stores at the graph nodes between the input's path and each weight (every
    weighted op's output gradient: a GPT block's q/k/v, MLP and projection outputs besides the block's own), each
    storage counted once. A weightless block keeps nothing. Gradients, buffers and the RNG as they were."""
    from torch.distributed.pipelining._backward import stage_backward_input

    chain = [*blocks, loss]
    device = example.device
    out: list[int] = []
    with as_they_were(chain, device):
        x = example
        for index, block in enumerate(chain):
            weights = [p for p in block.parameters() if p.requires_grad]
            x = x.detach().requires_grad_(x.is_floating_point() and index > 0)
            if not weights or not x.requires_grad:
                with torch.no_grad():
                    x = block(x)
                out.append(0)
                continue
            with torch.enable_grad():
                y = block(x)
                _, groups = stage_backward_input([y], None if y.dim() == 0 else [torch.ones_like(y)], [x],
                                                 iter(weights))
            grads = [g for group in groups for node in group.get("grads") or [] if node is not None
                     for g in (node if isinstance(node, tuple | list) else (node,)) if g is not None]
            storages = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}
            out.append(sum(storages.values()))
            x = y.detach()
    return out
