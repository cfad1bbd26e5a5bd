"""The training step's shared parts: the run's optimizer from its TrainParams, and clipping by the global norm."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from harness.method import TrainParams


def make_optimizer(parameters: Iterable[torch.nn.Parameter], params: TrainParams) -> torch.optim.Optimizer:
    """The run's optimizer from its hyperparameters: SGD (with momentum, Nesterov and weight decay when set) or AdamW
    (betas, eps, decoupled weight decay). foreach=False: the single-tensor arithmetic, so that a model cut into
    stages, each with its own optimizer, takes bit for bit the steps of the whole model's. The lr and momentum are
    the applied ones (TrainParams.applied_lr: `lr` and `momentum` unless the method's Params derive them)."""
    if params.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=params.applied_lr, betas=tuple(params.betas), eps=params.eps,
                                 weight_decay=params.weight_decay, foreach=False)
    return torch.optim.SGD(parameters, lr=params.applied_lr, momentum=params.applied_momentum,
                           weight_decay=params.weight_decay, nesterov=params.nesterov and params.applied_momentum > 0)


#: The former name of make_optimizer (it built SGD only), for plugins written against it.
make_sgd = make_optimizer


def clip_coefficient(squared_norm: float | torch.Tensor, max_norm: float) -> float:
    """The factor torch.nn.utils.clip_grad_norm_ scales gradients by at total norm sqrt(squared_norm): max_norm /
    (norm + 1e-6), capped at 1."""
    norm = float(squared_norm) ** 0.5
    return min(1.0, max_norm / (norm + 1e-6))


def squared_grad_norm(parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The sum of squares of the parameters' gradients (float64 on the CPU; those without a gradient count 0): the
    part of a global norm that one stage or shard holds. One fused call over every gradient (torch._foreach_norm)."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(torch._foreach_norm(grads)).double().square().sum().cpu()


def clip_gradients(parameters: Iterable[torch.nn.Parameter], max_norm: float | None,
                   squared_norm: float | torch.Tensor | None = None) -> float | None:
    """Scale the parameters' gradients so their global L2 norm is at most `max_norm` (nothing when it is None).
    `squared_norm` is the global sum of squares when the parameters hold only part of the model (a pipeline stage:
    the stages' sums reduced); by default theirs. -> the norm before clipping, or None."""
    if max_norm is None:
        return None
    parameters = [p for p in parameters if p.grad is not None]
    if squared_norm is None:
        squared_norm = squared_grad_norm(parameters)
    coefficient = clip_coefficient(squared_norm, max_norm)
    if coefficient < 1.0 and parameters:
        torch._foreach_mul_([p.grad.detach() for p in parameters], coefficient)
    return float(squared_norm) ** 0.5
