"""What methods share beyond the contract: the optimizer from TrainParams, a sharded classifier evaluation, and
the even split of a model's blocks (pipelines, Local Parallelism and the projection cut models the same way)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.data.tensors import TensorData
from harness.method import EvalResult, TrainParams


def make_sgd(parameters: Iterable[torch.nn.Parameter], params: TrainParams) -> torch.optim.SGD:
    """Plain SGD (with momentum, Nesterov and weight decay when set) from the run's hyperparameters."""
    return torch.optim.SGD(parameters, lr=params.lr, momentum=params.momentum, weight_decay=params.weight_decay,
                           nesterov=params.nesterov and params.momentum > 0)


@torch.no_grad()
def evaluate_classifier(model: nn.Module, test: TensorData, loss_fn: Callable[..., torch.Tensor],
                        comm: Communicator, batch_size: int = 512, device: torch.device | None = None,
                        shard: bool = True) -> EvalResult:
    """Accuracy and mean loss of `model` over the whole test set.

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
    for start in range(lo, hi, batch_size):
        idx = torch.arange(start, min(hi, start + batch_size))
        x, y = test.inputs(idx), test.targets(idx)
        if device is not None:
            x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += loss_fn(logits, y, reduction="sum").double().cpu()
        correct += (logits.argmax(dim=1) == y).sum().double().cpu()
    model.train(was_training)
    totals = torch.stack([correct, loss_sum])
    if shard and comm.world_size > 1:
        comm.all_reduce(totals, "eval")
    return EvalResult(accuracy=float(totals[0]) / n, loss=float(totals[1]) / n)


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
