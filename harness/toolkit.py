"""What methods share beyond the contract: the optimizer and gradient clipping, a sharded evaluation, even splits."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.data.tensors import TensorData
from harness.method import EvalResult, TrainParams


def make_optimizer(parameters: Iterable[torch.nn.Parameter], params: TrainParams) -> torch.optim.Optimizer:
    """The run's optimizer from its hyperparameters: SGD (with momentum, Nesterov and weight decay when set) or AdamW
    (betas, eps, decoupled weight decay). foreach=False: the single-tensor arithmetic, so that a model cut into
    stages, each with its own optimizer, takes bit for bit the steps of the whole model's."""
    if params.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=params.lr, betas=tuple(params.betas), eps=params.eps,
                                 weight_decay=params.weight_decay, foreach=False)
    return torch.optim.SGD(parameters, lr=params.lr, momentum=params.momentum, weight_decay=params.weight_decay,
                           nesterov=params.nesterov and params.momentum > 0)


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


@torch.no_grad()
def evaluate_classifier(model: nn.Module, test: TensorData, loss_fn: Callable[..., torch.Tensor],
                        comm: Communicator, batch_size: int = 512, device: torch.device | None = None,
                        shard: bool = True) -> EvalResult:
    """Accuracy and mean loss of `model` over the whole test set, per prediction: per sample for a classifier
    (logits N x C), per token for a language model (logits N x T x V, labels N x T).

    With `shard`, rank r evaluates the r-th contiguous shard and the sums are all-reduced (category `eval`), so
    every rank returns the same global numbers. Without it, every rank evaluates everything (no communication).
    """
    n = len(test)
    if shard and comm.world_size > 1:
        per = -(-n // comm.world_size)
        lo, hi = min(n, comm.rank * per), min(n, (comm.rank + 1) * per)
    else:
        lo, hi = 0, n
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.float64)
    loss_sum = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    for start in range(lo, hi, batch_size):
        idx = torch.arange(start, min(hi, start + batch_size))
        x, y = test.inputs(idx), test.targets(idx)
        if device is not None:
            x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += loss_fn(logits, y, reduction="sum").double().cpu()
        correct += (logits.argmax(dim=-1) == y).sum().double().cpu()
        count += y.numel()
    model.train(was_training)
    totals = torch.stack([correct, loss_sum, count])
    if shard and comm.world_size > 1:
        comm.all_reduce(totals, "eval")
    return EvalResult(accuracy=float(totals[0]) / float(totals[2]), loss=float(totals[1]) / float(totals[2]))


def uniform_split(num_blocks: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous [start, end) ranges of sizes as equal as possible; earlier parts take the extra blocks."""
    if not 1 <= parts <= num_blocks:
        raise ValueError(f"cannot cut {num_blocks} blocks into {parts} parts (need 1 <= parts <= blocks)")
    base, extra = divmod(num_blocks, parts)
    ranges, start = [], 0
    for index in range(parts):
        end = start + base + (1 if index < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges
