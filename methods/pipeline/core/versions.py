"""Weight-version policies: the interface (which weights a stage's forward of a microbatch uses and its backward
differentiates) and the live weights of synchronous pipelines; each asynchronous method keeps its own policy."""

from __future__ import annotations

import abc

import torch
from torch import nn

Weights = dict[str, torch.Tensor]


class WeightPolicy(abc.ABC):
    """A stage's weight versions. Version k is the stage's weights after k optimizer updates.

    `forward(mb)` returns (version id, weights): the weights are either None (run the live module) or a dict of
    tensors for torch.func.functional_call, which the backward of mb differentiates. The live parameters are only
    ever changed by the optimizer, never swapped around autograd (the failure of PipeDream's own code on torch >= 1.5,
    its issue #52).
    """

    def __init__(self, module: nn.Module):
        self.module = module
        # The live parameters, taken once: while a forward runs torch.func.functional_call on the module (a stash or a
        # prediction), the module's own entries are those tensors, so another thread (Q-FB's backward lane, copying
        # the weights after its update) reading module.named_parameters() then would copy the stash instead.
        self.parameters: dict[str, nn.Parameter] = dict(module.named_parameters())
        self.version = 0  # updates applied to the live weights

    @abc.abstractmethod
    def forward(self, mb: int) -> tuple[int, Weights | None]:
        """The version and weights the forward of microbatch `mb` uses."""

    def backward_done(self, mb: int) -> None:  # noqa: B027 - a hook: policies without stashes have nothing to do
        """The backward of `mb` has run: its weights may be released."""

    def before_update(self) -> None:  # noqa: B027 - a hook: most policies need nothing before an update
        """The optimizer is about to step the live weights (a policy may keep what it needs of them)."""

    def updated(self) -> None:
        """The optimizer has stepped the live weights."""
        self.version += 1

    def held(self) -> int:
        """Weight versions kept in memory besides the live one."""
        return 0

    def planned_versions(self, in_flight: int) -> int:
        """The most versions `held` will count when the stage holds `in_flight` microbatches (for the memory plan)."""
        return 0

    def snapshot(self) -> Weights:
        """A detached copy of the live weights, each a leaf that collects its own gradient (as its parameter would)."""
        return {name: p.detach().clone().requires_grad_(p.requires_grad) for name, p in self.parameters.items()}

    def needs_stash(self) -> bool:
        """Whether forwards must run on a kept version (an update can come between a forward and its backward)."""
        return False

    def abort(self, reason: str) -> None:  # noqa: B027 - a hook: only policies that make a forward wait need it
        """Another thread of the rank failed: wake a forward that waits for a version, with an error."""


class Live(WeightPolicy):
    """Synchronous pipelines (GPipe, 1F1B with a flush): every forward and backward uses the live weights, which
    change only at the flush."""

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        return self.version, None
