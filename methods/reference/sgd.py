"""The single-process reference every parallel method is measured against (`sgd`, also registered as `single`)."""

from __future__ import annotations

import torch

from harness.data.tensors import Batch
from harness.method import RunContext
from harness.optim import make_optimizer
from methods.reference.whole_model import WholeModelMethod


class SGD(WholeModelMethod):
    """for each global batch B: g = grad L(w; B); w <- optimizer(w, g): the run's optimizer (SGD with momentum and
    weight decay, or AdamW) and grad_clip, in one process. Registered as `sgd` (its first name) and as `single`,
    which does not name an optimizer; both run this class, and a run's method and labels keep the name its suite
    used."""

    name = "sgd"
    family = "reference"
    summary = "the single-process reference, with the run's optimizer (sgd and single name it alike)"
    max_world_size = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.model = ctx.workload.make_model().to(ctx.device)
        self.optimizer = make_optimizer(self.model.parameters(), ctx.params)

    def local_batch(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.inputs(), batch.targets()
