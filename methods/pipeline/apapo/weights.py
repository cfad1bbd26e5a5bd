"""PipeDream-2BW's double-buffered weights with the delay D as a parameter (APapo's weight versions)."""

from __future__ import annotations

import torch
from torch import nn

from methods.pipeline.compensation.prediction import Prediction, predicted_by_velocity
from methods.pipeline.core.versions import WeightPolicy, Weights


class DoubleBuffered(WeightPolicy):
    """PipeDream-2BW's weight versions (Narayanan et al., ICML 2021, section 3.1), with the delay D as a parameter.

    Microbatches are numbered globally, u = t·M + j for microbatch j of iteration t; the stage updates once per
    iteration. The forward and the backward of u use version max(0, t - D) (version k = the weights after k
    updates), so the update of iteration t is W(t+1) = W(t) - lr·grad f(W(t-D)): D = 1 is 2BW's
    W(t+1) = W(t) - lr·grad f(W(t-1)) and D = 0 plain SGD with gradient accumulation (the live weights). The
    schedule must have made version t - D before iteration t's first forward here (schedules.gate does).

    With D >= 1 the forwards run on detached copies (a version can change while its microbatches are in flight): the
    live version is copied at its first forward, or just before the optimizer steps it (before_update), and a copy
    is dropped once no backward in flight and no later iteration can use it. With D = 1 at most two copies exist.
    With prediction 'lwp_v' the copy of version k is the weights predicted D updates ahead of it, w_k - lr·D·v_k
    (Kosson et al.'s LWP_D), and the backward differentiates that same copy.
    """

    def __init__(self, module: nn.Module, microbatches: int, delay: int,
                 optimizer: torch.optim.Optimizer | None = None, prediction: Prediction = "none"):
        super().__init__(module)
        if microbatches < 1 or delay < 0:
            raise ValueError(f"need microbatches >= 1 and delay >= 0, got {microbatches} and {delay}")
        if prediction not in ("none", "lwp_v"):
            raise ValueError(f"double-buffered versions predict by velocity ('lwp_v') or not at all: {prediction!r}")
        if prediction == "lwp_v" and optimizer is None:
            raise ValueError("lwp_v reads the velocity from the stage's optimizer: pass it")
        self.microbatches, self.delay = microbatches, delay
        self.optimizer, self.prediction = optimizer, prediction
        self._versions: dict[int, Weights] = {}
        self._users: dict[int, set[int]] = {}  # version -> microbatches whose backward still needs it
        self._of: dict[int, int] = {}  # microbatch -> version

    def wanted_version(self, mb: int) -> int:
        return max(0, mb // self.microbatches - self.delay)

    def before_update(self) -> None:
        """The live version stays in use after the update (by iteration live + D), so keep a copy."""
        if self.delay > 0:
            self._keep_live()

    def _keep_live(self) -> None:
        """Copy the live version (with lwp_v: the weights predicted D updates ahead of it, w - lr·D·v, from the
        velocity it was made with, so iteration t runs on an estimate of version t instead of t - D)."""
        if self.version in self._versions:
            return
        params = self.parameters
        made = (predicted_by_velocity(params, self.optimizer, self.delay) if self.optimizer is not None
                and self.prediction == "lwp_v" else {name: p.detach().clone() for name, p in params.items()})
        self._versions[self.version] = {name: w.requires_grad_(params[name].requires_grad)
                                        for name, w in made.items()}

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        version = self.wanted_version(mb)
        if self.delay == 0:
            if version != self.version:
                raise RuntimeError(f"microbatch {mb} wants version {version}, the live one is {self.version}")
            return version, None
        if version == self.version:
            self._keep_live()
        if version not in self._versions:
            raise RuntimeError(f"microbatch {mb} wants version {version}, which is gone or not made yet (live "
                               f"{self.version}): the schedule broke the version gate")
        self._users.setdefault(version, set()).add(mb)
        self._of[mb] = version
        return version, self._versions[version]

    def backward_done(self, mb: int) -> None:
        version = self._of.pop(mb, None)
        if version is not None:
            self._users[version].discard(mb)
            self._prune()

    def updated(self) -> None:
        super().updated()
        self._prune()

    def _prune(self) -> None:
        """Later iterations want versions >= live - D; older ones go once their backwards are done."""
        for v in [v for v in self._versions if v < self.version - self.delay and not self._users.get(v)]:
            del self._versions[v]
            self._users.pop(v, None)

    def held(self) -> int:
        return len(self._versions)

    def planned_versions(self, in_flight: int) -> int:
        """Versions live - D to live."""
        return self.delay + 1 if self.delay > 0 else 0

    def needs_stash(self) -> bool:
        return self.delay > 0
