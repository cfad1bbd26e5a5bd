"""Spike Compensation (Kosson et al., MLSys 2021): momentum SGD whose update of a gradient delayed by D steps makes
the weights follow the undelayed trajectory from the step the gradient arrives on."""

from __future__ import annotations

import torch

from harness.memory import SCALAR_OPERANDS


def spike_coefficients(momentum: float, delay: int) -> tuple[float, float]:
    """(a, b) of SC_D: w <- w - lr·(a·v + b·g) with a = m^D and b = (1 - m^D) / (1 - m).

    A gradient g that arrives D steps late is applied at once with a·g + b·g = (1 - m^(D+1)) / (1 - m) · g, what
    undelayed momentum SGD had applied of it by then, and afterwards through v decaying as m^D·m^k, exactly the
    undelayed trajectory's remaining steps; a/(1-m) + b = 1/(1-m) keeps its total contribution. D = 0 gives a = 1,
    b = 0: plain momentum SGD. With m = 0 (no momentum) a = 0^D and b = 1 for D > 0: plain SGD as well."""
    if delay < 0:
        raise ValueError(f"delay must be >= 0, got {delay}")
    if delay == 0:
        return 1.0, 0.0
    a = momentum**delay
    b = (1.0 - a) / (1.0 - momentum) if momentum < 1 else float(delay)
    return a, b


class SpikeCompensatedSGD(torch.optim.Optimizer):
    """Undampened momentum SGD with spike compensation for gradients `delay` steps old:

        g <- g + weight_decay · w
        v <- m·v + g                 (v = g at the first step, as torch.optim.SGD)
        w <- w - lr·(a·v + b·g)       (a, b = spike_coefficients(m, delay))

    With delay 0 it performs exactly torch.optim.SGD's single-tensor arithmetic (momentum, no dampening, no Nesterov),
    so it is bitwise the same optimizer. The velocity is kept as 'momentum_buffer', as torch's SGD names it, so
    weight predictions can read it."""

    def __init__(self, params, lr: float, momentum: float = 0.0, delay: int = 0, weight_decay: float = 0.0):
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0 or delay < 0:
            raise ValueError(f"bad hyperparameters: lr {lr}, momentum {momentum}, delay {delay}, "
                             f"weight_decay {weight_decay}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "delay": delay, "weight_decay": weight_decay})

    def step_temporaries(self) -> int:
        """The most bytes one step holds at once beyond the weights, gradients and velocities (core/memory.py
        StatesTemporaries): where weight decay is on, the decayed gradient `grad = p.grad.add(p)` is a new tensor,
        and the previous parameter's is still bound to `grad` while it is made (s_i + s_(i-1), in step order); the
        rest is in place (`buf.mul_(m).add_(g)`, `p.add_(...)`); plus the 0-dim tensors a Python scalar operand is
        wrapped in (SCALAR_OPERANDS)."""
        worst = previous = 0
        for group in self.param_groups:
            for p in group["params"]:
                size = p.numel() * p.element_size() if group["weight_decay"] and p.requires_grad else 0
                worst, previous = max(worst, size + previous), size
        return worst + SCALAR_OPERANDS

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
            a, b = spike_coefficients(momentum, group["delay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if weight_decay == 0 else p.grad.add(p, alpha=weight_decay)
                if momentum == 0:
                    p.add_(grad, alpha=-lr)
                    continue
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = torch.clone(grad).detach()
                    state["momentum_buffer"] = buf
                else:
                    buf.mul_(momentum).add_(grad)
                if b == 0.0:  # a = 1: plain momentum SGD, torch's exact arithmetic
                    p.add_(buf, alpha=-lr)
                else:
                    p.add_(buf, alpha=-lr * a).add_(grad, alpha=-lr * b)
        return loss
