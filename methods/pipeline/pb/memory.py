"""PB's stage profiled whole at planning time with the allocator: what its forward keeps, and its backward's peak."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.memory import tensor_bytes
from harness.memory.peak import peak_of
from harness.memory.profile import as_they_were


@dataclass(frozen=True)
class StagePass:
    """One stage's forward and backward on a microbatch, by the allocator. `forward_peak`: the most bytes its forward
    holds at once (`no_grad_peak`: run without autograd, as a recomputing stage's first forward runs); `kept`: the
    bytes it leaves allocated (the saved tensors beyond its input, and its output); `backward_peak`: the most bytes
    its backward holds above what existed before it (the gradients it makes, its ops' gradients and workspaces, less
    the saved tensors autograd lets go as it goes: a stage's cells are weak, core/stage.py), the input's gradient
    (the dx sent back, a buffer of the plan's own) left out."""

    forward_peak: int
    no_grad_peak: int
    kept: int
    backward_peak: int


def stage_pass(module: nn.Module, example: torch.Tensor, loss: nn.Module | None, first: bool) -> StagePass:
    """StagePass of `module` (then `loss`, on the last stage) on `example`, the microbatch as the stage receives it
    (after the `first` stage, an activation that requires grad, as a received one does), as a step's first
    backward runs (no .grad yet). What the forward keeps is read with a probe: the forward then one allocation
    larger than the forward's own peak, so the pass's peak is the kept bytes plus the probe. Gradients, buffers and
    the RNG as they were."""
    chain = [module] if loss is None else [module, loss]
    params = [p for p in module.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    device = example.device
    try:
        with as_they_were(chain, device):
            x = example.detach().requires_grad_(not first and example.is_floating_point())
            held: list[torch.Tensor] = []

            def forward() -> None:
                with torch.enable_grad():
                    out = module(x)
                    held.append(out if loss is None else loss(out))

            forward_peak = peak_of(forward, device)
            with torch.no_grad():
                no_grad_peak = peak_of(lambda: module(x), device)
            probe = -(-forward_peak // 64) * 64 + 64  # larger than the forward's peak, 64-byte aligned
            held.clear()
            kept = peak_of(lambda: (forward(), held.append(torch.empty(probe, dtype=torch.uint8, device=device))),
                           device) - probe
            out = held[0]
            held.clear()
            grad = None if out.dim() == 0 else torch.ones_like(out)
            wrt = [*params, x] if x.requires_grad else params
            for p in params:
                p.grad = None
            peak = peak_of(lambda: torch.autograd.backward(out, grad, inputs=wrt), device)
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
    return StagePass(forward_peak, no_grad_peak, kept, max(0, peak - (tensor_bytes([x]) if x.requires_grad else 0)))
