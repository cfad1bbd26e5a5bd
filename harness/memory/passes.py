"""A forward and backward pass profiled with the allocator at planning time: its peak beyond what existed before."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from harness.memory.peak import peak_of
from harness.memory.profile import as_they_were


def pass_peak(run: Callable[[], Any], modules: Iterable[torch.nn.Module], device: torch.device,
              accumulate: bool = False) -> int:
    """The allocator's peak while `run()` does one forward and backward through `modules` (a training pass: it
    builds a loss and calls backward), net of what existed before it: the gradients it makes, the activations
    autograd saves, backward's transients (each op's output gradients and workspaces, freed as it goes) and the
    pass's own outputs. With `accumulate`, the parameters hold gradients before it (zeros, allocated outside the
    measurement) and the pass adds into them, as a later microbatch of gradient accumulation does.

    Left as found: gradients (None again, or what they were), buffers (normalisation statistics) and the RNG
    (dropout draws). This is how PipeDream's profiler measures a layer's memory: by running it once on the
    microbatch the plan is for."""
    modules = list(modules)
    params = list({id(p): p for m in modules for p in m.parameters() if p.requires_grad}.values())
    grads = [p.grad for p in params]
    try:
        for p in params:
            p.grad = torch.zeros_like(p) if accumulate else None
        with as_they_were(modules, device), torch.enable_grad():
            return peak_of(run, device)
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
