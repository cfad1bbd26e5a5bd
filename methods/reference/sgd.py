"""Single-process minibatch SGD: the reference every parallel method is measured against."""

from __future__ import annotations

import torch

from harness.data.tensors import Batch
from harness.method import RunContext
from harness.toolkit import make_optimizer
from methods.reference.whole_model import WholeModelMethod


class SGD(WholeModelMethod):
    """for each global batch B: g = grad L(w; B); w <- SGD(w, g) (optionally with momentum and weight decay)."""

    name = "sgd"
    family = "reference"
    summary = "single-process minibatch SGD, the reference"
    max_world_size = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.model = ctx.workload.make_model().to(ctx.device)
        self.optimizer = make_optimizer(self.model.parameters(), ctx.params)

    def local_batch(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.inputs(), batch.targets()
