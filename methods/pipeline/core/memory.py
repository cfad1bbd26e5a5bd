"""A pipeline's planned bytes per rank, before its first step: the microbatches each stage holds at its peak, walked
from the very schedules its executor will run, times the stage's profiled activations, with its weights,
gradients, optimizer state and the weight versions its policy keeps for that many."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from harness.memory import (
    Footprint,
    MemoryBytes,
    chain_saved_bytes,
    gradient_bytes,
    planned_optimizer_bytes,
    weight_bytes,
)
from harness.method import TrainParams
from harness.schedule.held import in_flight_peaks
from harness.trace import StepSchedule
from methods.pipeline.core.stage import Stage


def stage_plan(stage: Stage, blocks: tuple[int, int], prints: list[Footprint], held: int) -> MemoryBytes:
    """One stage's planned bytes when it holds `held` microbatches: weights, a gradient each, the optimizer's
    state, its policy's versions for that many, and that many microbatches' activations: autograd's saved tensors of
    blocks [a, b) (with the loss on the last stage; `prints` profiles every block and then the loss), or only the
    stage input where the backward recomputes (`current` mode)."""
    a, b = blocks
    if stage.backward_mode == "current":
        per_microbatch = prints[a].input_bytes
    else:
        per_microbatch = chain_saved_bytes(prints, a, b + 1 if stage.last else b)
    return MemoryBytes(weights=weight_bytes([stage.module]), gradients=gradient_bytes([stage.module]),
                       optimizer=planned_optimizer_bytes(stage.optimizer),
                       versions=stage.policy.planned_versions(held) * stage.param_bytes,
                       activations=held * per_microbatch)


def held_bytes(stage: Stage) -> MemoryBytes:
    """One stage's measured bytes over the run: each kind at its peak."""
    return MemoryBytes(weights=weight_bytes([stage.module]), gradients=stage.gradient_bytes,
                       optimizer=stage.optimizer_bytes, versions=stage.run_peak.weight_bytes,
                       activations=stage.run_peak.activation_bytes)


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
