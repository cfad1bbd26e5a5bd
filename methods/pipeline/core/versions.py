"""Weight-version policies: which weights a stage's forward of a microbatch uses and its backward differentiates
(live, PipeDream's stash, 2BW's one version behind, Linear Weight Prediction)."""

from __future__ import annotations

import abc
from typing import Literal

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


class Stashed(WeightPolicy):
    """PipeDream's weight stashing (Narayanan et al., SOSP 2019, section 3.3).

    The forward of minibatch t uses the newest weights and stashes them; the backward of t differentiates the stash,
    and the resulting gradient updates the live weights. Stage s of S thus keeps up to S-s versions (one per
    minibatch in flight). A stash is a detached copy made only when an update will come before the backward (at
    `delay` > 0), and shared by consecutive forwards of the same version.

    Vertical sync (optional): every stage runs the forward of minibatch t with version max(0, t - (S-1)), the version
    stage 0 used, so a minibatch sees one consistent set of weights across stages. The stage must then keep the
    versions it made in its last s updates as well.
    """

    def __init__(self, module: nn.Module, delay: int, stage: int = 0, stages: int = 1, vertical_sync: bool = False):
        super().__init__(module)
        self.delay, self.stage, self.stages, self.vertical_sync = delay, stage, stages, vertical_sync
        self._versions: dict[int, Weights] = {}
        self._users: dict[int, set[int]] = {}  # version -> minibatches whose backward still needs it
        self._of: dict[int, int] = {}  # minibatch -> version
        if vertical_sync:
            self._versions[0] = self.snapshot()

    def wanted_version(self, mb: int) -> int:
        lag = self.stages - 1 if self.vertical_sync else self.delay
        return max(0, mb - lag)

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        if not self.vertical_sync:
            if self.delay == 0:  # the backward comes before the next update: the live weights are the stash
                return self.version, None
            if self.version not in self._versions:
                self._versions[self.version] = self.snapshot()
            version = self.version
        else:
            version = self.wanted_version(mb)
            if version not in self._versions:
                raise RuntimeError(f"stage {self.stage}: version {version} for minibatch {mb} was not kept "
                                   f"(live version {self.version})")
        self._users.setdefault(version, set()).add(mb)
        self._of[mb] = version
        return version, self._versions[version]

    def backward_done(self, mb: int) -> None:
        version = self._of.pop(mb, None)
        if version is None:
            return
        self._users[version].discard(mb)
        self._prune()

    def updated(self) -> None:
        super().updated()
        if self.vertical_sync:
            self._versions[self.version] = self.snapshot()
        self._prune()

    def _prune(self) -> None:
        if self.vertical_sync:
            # The next forwards want versions >= (live - s): older ones without pending backwards can go.
            oldest_wanted = max(0, self.version - self.stage)
            keep = lambda v: v >= oldest_wanted or self._users.get(v)  # noqa: E731
        else:
            keep = lambda v: v == self.version or self._users.get(v)  # noqa: E731
        for v in [v for v in self._versions if not keep(v)]:
            del self._versions[v]
            self._users.pop(v, None)

    def held(self) -> int:
        return len(self._versions)

    def needs_stash(self) -> bool:
        return self.vertical_sync or self.delay > 0


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

    def needs_stash(self) -> bool:
        return self.delay > 0


class OneVersionBehind(WeightPolicy):
    """`sync = "bounded"`: the forwards of window t run on a copy of the weights taken when the window opens, before
    the update of window t-1 is applied, i.e. version t-1 (version k = after k updates); the backwards of window t
    differentiate that copy and their gradient updates the live weights. So W(t+1) = W(t) - lr · g(W(t-1)), the
    delay of PipeDream-2BW (Narayanan et al., ICML 2021), with W(-1) = W(0). At most two copies are held: the open
    window's and the one whose backwards still run."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.copies: dict[int, tuple[int, Weights]] = {}  # window -> (version, weights)
        self.current = -1

    def open_window(self, window: int) -> None:
        """Copy the live weights for the forwards of `window`; drop the copies windows before window-1 used."""
        self.copies[window] = (self.version, self.snapshot())
        self.current = window
        for old in [w for w in self.copies if w < window - 1]:
            del self.copies[old]

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        return self.copies[self.current]

    def held(self) -> int:
        return len(self.copies)

    def needs_stash(self) -> bool:
        return True


# -- Linear Weight Prediction (Kosson et al., MLSys 2021): the forward runs on the weights predicted for the time its
# backward comes, D updates later; optionally a stash of them for the backward.
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

    def needs_stash(self) -> bool:
        return self.stash and self.delay > 0
