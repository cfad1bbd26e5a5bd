"""A pipeline's memory prices, before its first step: a stage's profiled terms (stage_terms, for the runner's walk
of its schedules: core/step_bytes.py), each block's backward transient, what a stage measurably held, and the
planners' StageCost (the microbatches each position holds, walked from the method's steady-state step)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

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
from harness.memory.update import optimizer_step_temporaries
from harness.method import TrainParams
from harness.schedule.held import in_flight_peaks
from harness.trace import StepSchedule
from methods.pipeline.core.codecs import Codec, Plain
from methods.pipeline.core.stage import Stage
from methods.pipeline.core.step_bytes import StageTerms


def stage_terms(prints: list[Footprint], blocks: tuple[int, int], first: bool, last: bool,
                modules: list[nn.Module], optimizer: torch.optim.Optimizer, act: Codec, grad: Codec, batch: int,
                split: bool = False, versions: int = 0, recompute: bool = False,
                transients: list[int] | None = None) -> StageTerms:
    """The one price of a stage, for the runner's plan and the planners alike: blocks [a, b) of a chain profiled
    by `prints` (every block, then the loss) on a full microbatch, as the stage `first`/`last` in the chain, with
    `modules` its blocks and `optimizer` theirs, `act`/`grad` the wire's codecs, `batch` the step's inputs or
    labels it loads, `split` a zero-bubble B/W, `versions` the bytes of the weight versions its policy keeps, and
    `recompute` a backward that recomputes the stage from its input (only the input is kept), `transients` every
    block's backward transient (backward_transients; the stage's is its largest block's, the loss's too on the
    last stage)."""
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
    retained = 0
    if split and not first:  # B keeps, for W, the gradient at each weighted block's output
        retained = sum(prints[i].output_bytes for i, m in zip(range(a, b), modules_blocks(modules), strict=False)
                       if any(p.requires_grad for p in m.parameters(recurse=True)))
    return StageTerms(
        weights=weight_bytes(modules), gradients=gradient_bytes(modules),
        optimizer=planned_optimizer_bytes(optimizer), saved=max(0, saved), output=out, input=inp,
        recv_act=_payload(act, inp), recv_grad=_payload(grad, out),
        send_act=0 if isinstance(act, Plain) else _payload(act, out),
        send_grad=0 if isinstance(grad, Plain) else _payload(grad, inp),
        grad_input=inp, retained=retained, batch=batch, update_temps=optimizer_step_temporaries(optimizer),
        backward_temps=max(transients[a:b + 1 if last else b], default=0) if transients else 0,
        versions=versions)


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


@dataclass(frozen=True)
class StageCost:
    """How a planner prices a candidate stage's bytes per replica before any stage exists, with the plan's own
    kinds: weights and a gradient each, the optimizer's state (`optimizer_slots` per parameter byte), the weight
    versions the method keeps (`versions(stages after, the only stage, microbatches held)`), and the activations of
    the microbatches it holds. `in_flight[a]`: the microbatches a stage with a stages after it holds, walked from the
    method's own steady-state step (one stage per rank); a replica holds its share of them."""

    in_flight: tuple[int, ...]
    optimizer_slots: float
    versions: Callable[[int, bool, int], int]

    def held(self, replicas: int, after: int) -> int:
        return -(-self.in_flight[min(after, len(self.in_flight) - 1)] // replicas)

    def bytes(self, param_bytes: int, saved_per_microbatch: int, replicas: int, after: int, alone: bool) -> int:
        held = self.held(replicas, after)
        return int(param_bytes * (2 + self.optimizer_slots + self.versions(after, alone, held))
                   + held * saved_per_microbatch)


def in_flight_by_after(step: StepSchedule, lanes: bool = False) -> tuple[int, ...]:
    """Microbatches each stage of a steady-state step (one stage per rank) holds at its peak, indexed by the number
    of stages after it: the step walked 4S + 4 times, each copy's ids shifted as the next step's are."""
    stages = len(step.ranks)
    steps = [[[replace(a, mb=None if a.mb is None else a.mb + k * step.shift,
                       iteration=a.iteration + k * step.iteration_shift) for a in actions] for actions in step.ranks]
             for k in range(4 * stages + 4)]
    peaks = in_flight_peaks(steps, lanes)
    return tuple(max(1, peaks.get((s, s), 0)) for s in reversed(range(stages)))


def optimizer_slots(params: TrainParams) -> float:
    """Optimizer-state bytes per parameter byte: AdamW's two moments, momentum SGD's buffer, else none."""
    return 2.0 if params.optimizer == "adamw" else 1.0 if params.momentum else 0.0


def backward_transients(blocks: list[nn.Module], example: torch.Tensor, loss: nn.Module,
                        prints: list[Footprint]) -> list[int]:
    """Each block's backward transient on `example` fed through the chain (`loss` last; `prints` their
    footprints): the allocator's peak over one forward and backward of the block alone (harness/memory/passes.py;
    the block's input and the gradient flowing in exist before it) less what the plan counts apart (the block's
    saved tensors, its output, its parameters' gradients): the gradient flowing out and the ops' own gradients and
    workspaces. A stage's backward transient is its largest block's. Buffers (BatchNorm's statistics) and the RNG
    are as they were on return."""
    chain = [*blocks, loss]
    device = example.device
    devices = [device.index or 0] if device.type == "cuda" else []
    kept = [[b.detach().clone() for b in block.buffers()] for block in chain]
    out: list[int] = []
    try:
        with torch.random.fork_rng(devices=devices):
            x = example
            for index, block in enumerate(chain):
                x = x.detach().requires_grad_(x.is_floating_point() and index > 0)
                with torch.no_grad():
                    y = block(x)
                grad = torch.ones_like(y) if y.dim() else None

                def one(block: nn.Module = block, x: torch.Tensor = x, grad: torch.Tensor | None = grad) -> None:
                    z = block(x)
                    z.backward(grad)
                    x.grad = None

                peak = pass_peak(one, [block], device)
                p = prints[index]
                counted = p.saved_bytes + (0 if p.saves_output else p.output_bytes) + gradient_bytes([block])
                out.append(max(0, peak - counted))
                x = y
    finally:
        with torch.no_grad():
            for block, values in zip(chain, kept, strict=True):
                for buffer, value in zip(block.buffers(), values, strict=True):
                    buffer.copy_(value)
    return out
