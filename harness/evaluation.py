"""Sharded evaluation of a whole model on the test set: accuracy and mean loss per prediction, on every rank."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.data.tensors import TensorData
from harness.method import EvalResult


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
