"""A training step's plan composed from its phases: what is held throughout, and each phase's peak beyond it."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.memory.kinds import MemoryBytes


def batch_bytes(data, samples: int, inputs: bool = True, targets: bool = True) -> int:
    """The bytes of a step's (x, y) for `samples` samples of `data` (a TensorData) as a rank holds them through its
    step: the inputs, the targets, or both (a pipeline's first stage holds x, its last y)."""
    index = torch.arange(min(1, len(data)))
    total = 0
    if inputs:
        x = data.inputs(index)
        total += samples * (x.numel() // max(1, len(index))) * x.element_size()
    if targets:
        y = data.targets(index)
        total += samples * (y.numel() // max(1, len(index))) * y.element_size()
    return total


def step_plan(held: MemoryBytes, phases: Mapping[str, int]) -> MemoryBytes:
    """The plan of a step whose `held` kinds (weights, optimizer, versions, buffers, inputs: alive throughout;
    gradients and activations: at their peaks) are joined, one phase at a time, by what each phase of `phases`
    holds at its peak beyond the kinds alive throughout (the forward and backward pass, profiled: its gradients,
    activations and transients; the update: the gradients and the optimizer's temporaries; a communication hook's
    payloads). `temporaries` is the largest phase's excess over the gradients and activations the plan already
    counts (never below 0), so the plan's total is the largest phase on top of what is alive throughout, or the
    kinds' sum where that is larger."""
    worst = max(phases.values(), default=0)
    excess = max(0, worst - held.gradients - held.activations)
    return MemoryBytes(**{**held.as_dict_kinds(), "temporaries": excess})
