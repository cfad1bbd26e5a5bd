"""PB's weight policy: a forward runs on the weights Linear Weight Prediction (Kosson et al., MLSys 2021) gives for
its backward (methods/pipeline/compensation/prediction.py), or on the live ones."""

from __future__ import annotations

import torch
from torch import nn

from methods.pipeline.compensation.prediction import Prediction, predict_by_difference, predicted_by_velocity
from methods.pipeline.core.versions import WeightPolicy, Weights


class Predicted(WeightPolicy):
    """A stage's forwards run on weights predicted `delay` updates ahead (when prediction is not 'none' and delay > 0),
    or on the live weights. With `stash`, the forward's weights (predicted, or a copy of the live ones) are kept for
    its backward, which differentiates them (the stage's `graph` mode); without, the stage's backward recomputes with
    the weights current at backward time (`current` mode) and nothing is kept.

    lwp_v reads the velocity from the stage optimizer's state ('momentum_buffer', as torch's SGD and
    SpikeCompensatedSGD keep it) and the lr of its first parameter group; lwp_w keeps the weights before the last
    update. Under plain momentum SGD the two are equal (w - w_prev = -lr·v); under spike compensation they differ
    (the last update also carries b·g)."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, delay: int, prediction: Prediction,
                 stash: bool):
        super().__init__(module)
        self.optimizer, self.delay, self.prediction, self.stash = optimizer, delay, prediction, stash
        self._params = dict(module.named_parameters())
        self._previous: dict[str, torch.Tensor] | None = None
        self._kept: dict[int, Weights] = {}  # mb -> the weights its forward used (stash only)

    def predicted(self) -> Weights:
        """The weights predicted `delay` updates ahead, as detached tensors."""
        if self.prediction == "lwp_v":
            return predicted_by_velocity(self._params, self.optimizer, self.delay)
        previous = self._previous or {}
        return {name: predict_by_difference(p, previous.get(name), self.delay) for name, p in self._params.items()}

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        if self.prediction != "none" and self.delay > 0:
            weights = self.predicted()
        elif self.stash and self.delay > 0:
            weights = {name: p.detach().clone() for name, p in self._params.items()}
        else:
            return self.version, None
        weights = {name: w.requires_grad_(self._params[name].requires_grad) for name, w in weights.items()}
        if self.stash:
            self._kept[mb] = weights
        return self.version, weights

    def backward_done(self, mb: int) -> None:
        self._kept.pop(mb, None)

    def before_update(self) -> None:
        if self.prediction == "lwp_w":
            self._previous = {name: p.detach().clone() for name, p in self._params.items()}

    def held(self) -> int:
        return len(self._kept) + (self._previous is not None)

    def planned_versions(self, in_flight: int) -> int:
        """The weights of every forward in flight where they are kept, and lwp_w's weights before the last update."""
        return (in_flight if self.stash and self.delay > 0 else 0) + (self.prediction == "lwp_w")

    def forward_bytes(self) -> int:
        """The most bytes a forward's weights take while they are made (for the plan; 0: it runs the live ones): the
        weights made so far and, for a prediction, one temporary of the parameter being predicted (lwp_v's lr·D·v;
        lwp_w's difference, then its multiple), in the parameters' order."""
        predicts = self.prediction != "none" and self.delay > 0
        if not predicts and not self.needs_stash():
            return 0
        worst = made = 0
        for p in self._params.values():
            size = p.numel() * p.element_size()
            made += size
            worst = max(worst, made + size * predicts)
        return worst

    def needs_stash(self) -> bool:
        return self.stash and self.delay > 0
