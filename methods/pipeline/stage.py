"""One pipeline stage's numerics: forward and backward of a microbatch under a weight-version policy, and the update."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from methods.pipeline.versions import WeightPolicy


@dataclass
class _Saved:
    inputs: torch.Tensor
    output: torch.Tensor  # the stage output, or the scaled loss on the last stage
    version: int
    weights: dict[str, torch.Tensor] | None


class Stage:
    """Blocks [start, end) of the model, with their optimizer and weight-version policy.

    The last stage turns outputs into the loss: loss_fn(output, y) * scale, where `scale` is the microbatch's share
    of the minibatch (its size over the minibatch size), so the gradients summed over the microbatches are those of
    the minibatch's mean loss, as single-process SGD computes them.
    """

    def __init__(self, index: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                 policy: WeightPolicy, loss_fn: Callable[..., torch.Tensor]):
        self.index, self.stages, self.module = index, stages, module
        self.optimizer, self.policy, self.loss_fn = optimizer, policy, loss_fn
        self.first, self.last = index == 0, index == stages - 1
        self._params = dict(module.named_parameters())
        self._saved: dict[int, _Saved] = {}
        self.loss_sum = 0.0  # the minibatch loss accumulated by the last stage since the last `take_loss`

    def forward(self, mb: int, x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        """Run the forward of microbatch `mb`; returns the output to send on (the loss on the last stage)."""
        if not self.first:
            x = x.detach().requires_grad_(True)
        version, weights = self.policy.forward(mb)
        out = self.module(x) if weights is None else functional_call(self.module, weights, (x,))
        if self.last:
            out = self.loss_fn(out, y) * scale
            self.loss_sum += out.item()
        self._saved[mb] = _Saved(x, out, version, weights)
        return out

    def backward(self, mb: int, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        """Run the backward of microbatch `mb` (with the weights its forward used); the parameter gradient is added to
        the live parameters' .grad. Returns the gradient w.r.t. the stage input (None on the first stage)."""
        saved = self._saved.pop(mb)
        if saved.weights is None:  # the live weights: autograd accumulates into their .grad, as loss.backward() does
            wrt = list(self._params.values())
        else:  # a stash: its leaves collect the gradient, which then moves to the live parameters
            wrt = [saved.weights[name] for name in self._params]
        inputs = wrt if self.first else [*wrt, saved.inputs]
        torch.autograd.backward(saved.output, grad_output, inputs=inputs)
        if saved.weights is not None:
            for p, w in zip(self._params.values(), wrt, strict=True):
                if w.grad is None:
                    continue
                if p.grad is None:
                    p.grad = w.grad
                else:
                    p.grad.add_(w.grad)
                w.grad = None  # a stash can serve several minibatches (stashed once per version)
        self.policy.backward_done(mb)
        return None if self.first else saved.inputs.grad

    def version_of(self, mb: int) -> int:
        return self._saved[mb].version

    def update(self) -> None:
        """The optimizer step on the accumulated gradients, then clear them: the next weight version."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy.updated()

    def take_loss(self) -> float:
        loss, self.loss_sum = self.loss_sum, 0.0
        return loss

    def in_flight(self) -> int:
        return len(self._saved)
