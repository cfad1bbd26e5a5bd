"""Single-process SGD with gradient-norm clipping: a complete dtbench method outside the dtbench tree."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from harness.data.tensors import Batch, TensorData
from harness.method import EvalResult, Method, RunContext, StepStats, TrainParams
from harness.toolkit import evaluate_classifier, make_optimizer


class ClippedParams(TrainParams):
    """The run's SGD hyperparameters, plus the clipping threshold."""

    max_norm: float = Field(default=1.0, gt=0, description="the global gradient norm is clipped to this")


class ClippedSGD(Method):
    """for each global batch B: g = grad L(w; B); g <- g * min(1, max_norm / ||g||); w <- SGD(w, g)."""

    name = "clipped-sgd"
    family = "reference"
    summary = "single-process SGD with global gradient-norm clipping (an out-of-tree example)"
    Params = ClippedParams
    max_world_size = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.model = ctx.workload.make_model().to(ctx.device)
        self.optimizer = make_optimizer(self.model.parameters(), ctx.params)

    def train_step(self, batch: Batch) -> StepStats:
        x, y = batch.inputs().to(self.ctx.device), batch.targets().to(self.ctx.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.ctx.workload.loss(self.model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ctx.params.max_norm)
        self.optimizer.step()
        return StepStats(loss=loss.item(), extra={"grad_norm": float(norm)})

    def evaluate(self, test: TensorData) -> EvalResult:
        return evaluate_classifier(self.model, test, self.ctx.workload.loss, self.ctx.comm,
                                   self.ctx.params.eval_batch_size, self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
