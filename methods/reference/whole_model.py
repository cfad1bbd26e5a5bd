"""The base of methods that hold the whole model on every rank (sgd, ddp, compressed ddps): step, evaluation, state."""

from __future__ import annotations

import abc
from typing import Any

import torch
from torch import nn

from harness.data.tensors import Batch, TensorData
from harness.method import EvalResult, Method, StepStats
from harness.toolkit import clip_gradients, evaluate_classifier


class WholeModelMethod(Method):
    """for each step: (x, y) = the samples this rank trains on; g = grad L(w; x, y); g <- g · min(1, c / |g|) when
    grad_clip = c; w <- optimizer(w, g).

    Subclasses build `self.model` (what runs the forward: the network itself, or its DistributedDataParallel
    wrapper) and `self.optimizer`, and say which samples a rank takes (`local_batch`). The plain network is
    `self.network`; evaluation, checkpoints and tests read it.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    #: Whether the step clips the gradient the optimizer sees to grad_clip (its global norm: after DDP's all-reduce
    #: every rank holds the same averaged gradient, so the same norm). DGC clips each rank's own gradient instead.
    clips_update: bool = True

    @property
    def network(self) -> nn.Module:
        """The plain model (unwrapped from DistributedDataParallel where it is wrapped)."""
        return getattr(self.model, "module", self.model)

    @abc.abstractmethod
    def local_batch(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) this rank trains on at this step."""

    def train_step(self, batch: Batch) -> StepStats:
        x, y = self.local_batch(batch)
        x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.ctx.workload.loss(self.model(x), y)
        loss.backward()
        if self.clips_update:
            clip_gradients(self.model.parameters(), self.ctx.params.grad_clip)
        self.optimizer.step()
        return StepStats(loss=loss.item())

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def evaluate(self, test: TensorData) -> EvalResult:
        return evaluate_classifier(self.network, test, self.ctx.workload.loss, self.ctx.comm,
                                   self.ctx.params.eval_batch_size, self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.network.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
