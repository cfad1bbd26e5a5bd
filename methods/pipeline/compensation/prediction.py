"""Linear Weight Prediction (Kosson et al., MLSys 2021): the rules that predict a stage's weights D updates ahead, which
PB's and APapo's weight policies apply."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from methods.pipeline.core.versions import Weights

#: What a forward runs on: the live weights ('none'), or those predicted for when its backward comes, D updates later:
#: by the optimizer's velocity ('lwp_v') or by repeating the last update ('lwp_w').
Prediction = Literal["none", "lwp_v", "lwp_w"]


#: Why a params model refuses lwp_v without momentum (PB's and APapo's validators).
NO_VELOCITY = ("prediction = 'lwp_v' predicts with the velocity, and momentum 0 keeps none, so it would predict "
               "nothing: set momentum > 0 or prediction = 'none'")


def predict_by_velocity(weights: torch.Tensor, velocity: torch.Tensor | None, lr: float, delay: int) -> torch.Tensor:
    """lwp_v: w - lr·D·v. Momentum SGD moves the weights by -lr·v per step; D steps of the current velocity."""
    return weights.detach().clone() if velocity is None else weights.detach() - (lr * delay) * velocity


def predicted_by_velocity(params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer, delay: int
                          ) -> Weights:
    """lwp_v on every parameter, detached: the velocity from the optimizer's state ('momentum_buffer', as torch's SGD
    and SpikeCompensatedSGD keep it; none yet: the weights as they are) and the lr of its first parameter group."""
    lr = optimizer.param_groups[0]["lr"]
    return {name: predict_by_velocity(p, optimizer.state.get(p, {}).get("momentum_buffer"), lr, delay)
            for name, p in params.items()}


def predict_by_difference(weights: torch.Tensor, previous: torch.Tensor | None, delay: int) -> torch.Tensor:
    """lwp_w: w + D·(w - w_prev). The last update, repeated D times."""
    return weights.detach().clone() if previous is None else weights.detach() + delay * (weights.detach() - previous)
