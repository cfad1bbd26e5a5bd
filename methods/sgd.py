"""Single-process minibatch SGD: the reference every parallel method is measured against."""

from __future__ import annotations

from typing import Any

from harness.data import Batch, TensorData
from harness.method import EvalResult, Method, RunContext, StepStats
from harness.training import evaluate_classifier, make_sgd


class SGD(Method):
    """for each global batch B: g = grad L(w; B); w <- SGD(w, g) (optionally with momentum and weight decay)."""

    name = "sgd"
    family = "reference"
    summary = "single-process minibatch SGD, the reference"
    max_world_size = 1

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.model = ctx.workload.make_model().to(ctx.device)
        self.optimizer = make_sgd(self.model.parameters(), ctx.params)

    def train_step(self, batch: Batch) -> StepStats:
        x, y = batch.inputs().to(self.ctx.device), batch.targets().to(self.ctx.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.ctx.workload.loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return StepStats(loss=loss.item())

    def evaluate(self, test: TensorData) -> EvalResult:
        return evaluate_classifier(self.model, test, self.ctx.workload.loss, self.ctx.comm,
                                   self.ctx.params.eval_batch_size, self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
