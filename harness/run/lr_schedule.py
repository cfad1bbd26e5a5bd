"""Learning-rate schedules: the factor on every optimizer's base lr at each step, a pure function of the step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def schedule_problem(params: Any, max_steps: int | None, max_epochs: float | None) -> tuple[str, str] | None:
    """The one place the rules between a run's lr schedule and its budget are written, checked before anything runs
    (suite validation and `dtbench rerun`): None, or (the parameter at fault, why) when a step or cosine schedule has
    no planned step count, or a cosine schedule's warm-up is not shorter than the budget in the unit both give
    (steps against max_steps, epochs against max_epochs). `params` is a TrainParams."""
    kind = params.lr_schedule
    if kind != "constant" and max_steps is None and max_epochs is None:
        return "lr_schedule", (f"{kind!r} needs a planned number of steps: give the budget max_epochs or max_steps "
                               "(max_train_seconds alone does not say where the budget ends)")
    if kind == "cosine" and max_steps is not None and params.lr_warmup_steps >= max_steps:
        return "lr_warmup_steps", (f"a warm-up of {params.lr_warmup_steps} steps leaves the cosine schedule none of "
                                   f"the budget's {max_steps} steps: shorten it")
    if kind == "cosine" and max_epochs is not None and params.lr_warmup_epochs >= max_epochs:
        return "lr_warmup_epochs", (f"a warm-up of {params.lr_warmup_epochs:g} epochs leaves the cosine schedule "
                                    f"none of the budget's {max_epochs:g} epochs: shorten it")
    return None


@dataclass(frozen=True)
class LrSchedule:
    """The learning-rate factor f(t) of step t (0-based: the step about to run), the same for every method.

    With W warm-up steps, start factor s, T planned steps, milestone steps M_i = round(m_i · T) and factor gamma:

        warm(t)   = s + (1 - s) · t / W   for t < W, else 1           (linear warm-up, torch's LinearLR)
        constant:  main(t) = 1
        step:      main(t) = gamma ** #{i : t >= M_i}                 (torch's MultiStepLR)
        cosine:    main(t) = (1 + cos(pi · min(1, max(0, t - W) / (T - W)))) / 2   (to 0 at T, after the warm-up)
        f(t)      = warm(t) · main(t)

    Each param group's lr at step t is its base lr (as the method built it) times f(t), so groups keep their ratios.
    """

    kind: str = "constant"
    warmup_steps: int = 0
    warmup_start_factor: float = 0.1
    milestone_steps: tuple[int, ...] = ()
    gamma: float = 0.1
    total_steps: int | None = None

    @classmethod
    def from_params(cls, params: Any, steps_per_epoch: int, total_steps: int | None) -> LrSchedule:
        """The schedule of a run: `params` (its TrainParams, validated, with schedule_problem checked before the
        run), the data order's steps per epoch and the budget's planned steps. A warm-up given in epochs against a
        budget in steps can only be compared here, with the data's size: ValueError when it leaves a cosine schedule
        no steps."""
        kind = params.lr_schedule
        warmup = params.lr_warmup_steps or round(params.lr_warmup_epochs * steps_per_epoch)
        milestones = tuple(round(m * total_steps) for m in params.milestones) if kind == "step" and total_steps else ()
        if kind == "cosine" and total_steps is not None and warmup >= total_steps:
            raise ValueError(f"the lr warm-up ({warmup} steps) is not shorter than the planned {total_steps} steps, so "
                             "the cosine schedule would have no steps left: shorten lr_warmup_steps or "
                             "lr_warmup_epochs, or lengthen the budget")
        return cls(kind, warmup, params.lr_warmup_start_factor, milestones, params.gamma, total_steps)

    @property
    def is_constant(self) -> bool:
        """True when f(t) = 1 at every step: the runner then leaves the optimizers alone."""
        return self.kind == "constant" and self.warmup_steps == 0

    def warmup(self, step: int) -> float:
        if step >= self.warmup_steps:
            return 1.0
        s = self.warmup_start_factor
        return s + (1.0 - s) * step / self.warmup_steps

    def main(self, step: int) -> float:
        if self.kind == "step":
            return self.gamma ** sum(step >= m for m in self.milestone_steps)
        if self.kind == "cosine":
            span = (self.total_steps or 0) - self.warmup_steps
            progress = 1.0 if span <= 0 else min(1.0, max(0, step - self.warmup_steps) / span)
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    def factor(self, step: int) -> float:
        """f(step), the multiplier of every base lr at the 0-based step `step`."""
        return self.warmup(step) * self.main(step)
