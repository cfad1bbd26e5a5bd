"""The update's temporaries: the bytes optimizer.step() and gradient clipping allocate and free, as torch runs them."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

#: The 0-dim tensors torch wraps a Python scalar operand in while an op runs (a double each: `exp_avg_sq.sqrt() /
#: c`, `lerp_(grad, 1 - beta1)`): at most two alive at once in the steps above, measured on the CPU as 12 bytes.
SCALAR_OPERANDS = 16


def optimizer_path(optimizer: torch.optim.Optimizer, group: dict) -> str:
    """'fused', 'foreach' or 'single': the implementation torch's step runs for this param group, decided as torch
    decides it (an explicit `fused`/`foreach` in the group, else `_default_to_fused_or_foreach`: foreach where every
    parameter is on a device with foreach kernels, i.e. CUDA; the single-tensor loop on the CPU)."""
    if group.get("fused"):
        return "fused"
    foreach = group.get("foreach")
    if foreach is None:
        params = [p for p in group["params"] if p.requires_grad]
        _, foreach = _default_to_fused_or_foreach(params, bool(group.get("differentiable", False)), False)
    return "foreach" if foreach else "single"


def _sizes(group: dict) -> list[int]:
    return [p.numel() * p.element_size() for p in group["params"] if p.requires_grad]


def optimizer_step_temporaries(optimizer: torch.optim.Optimizer) -> int:
    """The most bytes one `optimizer.step()` holds at once beyond its parameters, gradients and state (after the
    first step, whose state it creates), with s_i a parameter's bytes in its group's order:

    Adam / AdamW (torch/optim/adam.py). single: per parameter `denom = (exp_avg_sq.sqrt() / c).add_(eps)`: the sqrt
    and the quotient are alive together while the last parameter's denom is still bound, 2 s_i + s_(i-1); plus
    s_i for a gradient made anew (`grad.add(param)`: Adam's coupled weight decay; `-grad`: maximize).
    foreach (`_multi_tensor_adam`): `_foreach_sqrt` of every second moment at once, sum s_i, plus sum s_i for
    the same new gradients. fused: none.
    SGD (torch/optim/sgd.py). single: `grad.add(param, alpha=wd)` with weight decay, `grad.add(buf)` with Nesterov,
    `-grad` with maximize: those made for one parameter at once. foreach: the same lists for every parameter at
    once (`_foreach_add`, `_foreach_neg`). fused: none.
    Other optimizers: one parameter's worth per parameter at once (their single-tensor loops), an estimate.
    Each adds SCALAR_OPERANDS."""
    worst = 0
    for group in optimizer.param_groups:
        sizes = _sizes(group)
        if not sizes:
            continue
        path = optimizer_path(optimizer, group)
        if path == "fused":
            continue
        if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
            fresh = int(bool(group.get("weight_decay")) and not decoupled) + int(bool(group.get("maximize")))
            if path == "foreach":
                worst = max(worst, (1 + fresh) * sum(sizes))
            else:
                worst = max(worst, max((2 + fresh) * s + (sizes[i - 1] if i else 0) for i, s in enumerate(sizes)))
        elif isinstance(optimizer, torch.optim.SGD):
            fresh = (int(bool(group.get("weight_decay"))) + int(bool(group.get("nesterov")) and group["momentum"] > 0)
                     + int(bool(group.get("maximize"))))
            worst = max(worst, fresh * (sum(sizes) if path == "foreach" else max(sizes)))
        else:
            worst = max(worst, sum(sizes) if path == "foreach" else max(sizes))
    return worst + SCALAR_OPERANDS


def clip_temporaries(parameters: Iterable[torch.nn.Parameter]) -> int:
    """The bytes harness/optim.py's clip_gradients allocates at once for these parameters' global norm:
    `torch._foreach_norm` (one fp32 scalar per gradient), their `torch.stack`, its float64 copy and its square (a
    float64 per gradient each); the scaling (`_foreach_mul_`) is in place."""
    n = sum(1 for p in parameters if p.requires_grad)
    return 4 * n + 4 * n + 8 * n + 8 * n if n else 0
