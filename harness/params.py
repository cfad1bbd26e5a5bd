"""The hyperparameters every method takes (TrainParams), which each method's Params extend: pydantic only, so that a
run spec holds them typed without importing torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError


def _not_derived(derived: Any) -> PydanticCustomError:
    """The error of a derived value (a computed field) that spec.json records but its keys do not give (the value
    recorded is the error's input)."""
    return PydanticCustomError("derived", "not what the keys it derives from give ({derived})",
                               {"derived": repr(derived)})


class TrainParams(BaseModel):
    """Hyperparameters every method takes. `batch_size` is the global batch (all ranks together).

    The learning-rate schedule (`lr_schedule`, `lr_warmup_epochs` or `lr_warmup_steps`, `lr_warmup_start_factor`,
    `milestones`, `gamma`) is applied by the runner to every method alike (harness/run/lr_schedule.py); a method
    only builds its optimizers with `lr` and exposes them through `Method.optimizers`. So are the optimizer
    (`optimizer`: momentum SGD, or AdamW with `betas`, `eps` and `weight_decay`; harness/optim.py make_optimizer
    builds it) and gradient clipping (`grad_clip`: the global L2 norm of the step's gradient, as
    torch.nn.utils.clip_grad_norm_; a pipeline or a set of replicas reduces the norm across its stages and ranks, so
    a synchronous method still equals sgd).
    """

    # No inf lr, no NaN momentum; strict: lr = "0.05" or nesterov = "yes" is an error for every method's Params,
    # never converted (lr = 1, an int where a float belongs, is still accepted).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=0.05, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    nesterov: bool = False
    optimizer: Literal["sgd", "adamw"] = Field(
        default="sgd", description="sgd (momentum, nesterov, weight_decay as set) or adamw (betas, eps, weight_decay "
                                   "decoupled, Loshchilov and Hutter 2019)")
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2,
                               description="adamw: the moments' decay rates (momentum and nesterov are sgd's)")
    eps: float = Field(default=1e-8, gt=0, description="adamw: the denominator's epsilon")
    grad_clip: float | None = Field(default=None, gt=0,
                                    description="clip the step's gradient to this global L2 norm (None: off)")
    eval_batch_size: int = Field(default=512, ge=1)
    lr_schedule: Literal["constant", "step", "cosine"] = Field(
        default="constant", description="the lr after warm-up: constant; step (times gamma at each milestone); cosine "
                                        "(to 0 at the end of the planned steps)")
    lr_warmup_epochs: float = Field(default=0.0, ge=0, description="epochs of linear lr warm-up (0: none)")
    lr_warmup_steps: int = Field(default=0, ge=0, description="steps of linear lr warm-up, instead of epochs (0: none)")
    lr_warmup_start_factor: float = Field(default=0.1, gt=0, le=1,
                                          description="the warm-up starts at lr times this factor")
    milestones: list[float] = Field(default_factory=lambda: [0.5, 0.75],
                                    description="step schedule: fractions of the planned steps where the lr drops")
    gamma: float = Field(default=0.1, gt=0, description="step schedule: the lr is multiplied by gamma at a milestone")

    @model_validator(mode="after")
    def _one_warmup(self) -> TrainParams:
        if self.lr_warmup_epochs and self.lr_warmup_steps:
            raise ValueError("give lr_warmup_epochs or lr_warmup_steps, not both")
        return self

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: list[float]) -> list[float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError("betas must be two numbers in [0, 1)")
        return value

    @field_validator("milestones")
    @classmethod
    def _fractions_in_order(cls, value: list[float]) -> list[float]:
        if any(not 0 < m < 1 for m in value) or value != sorted(set(value)):
            raise ValueError("milestones must be increasing fractions of the budget, each between 0 and 1")
        return value

    @property
    def applied_lr(self) -> float:
        """The lr the run's optimizers are built with, before the schedule's factor: `lr`, unless the method's
        Params derive it from other keys (then a computed field, which spec.json records beside them: PB's
        reference_batch). The runner logs it times the schedule's factor."""
        return self.lr

    @property
    def applied_momentum(self) -> float:
        """The momentum the run's optimizers are built with: `momentum`, unless derived (as applied_lr)."""
        return self.momentum

    @classmethod
    def from_spec(cls, values: dict[str, Any]) -> TrainParams:
        """The params of a resolved run read back from its spec.json (RunSpec reads them so, once: `dtbench rerun`,
        a stored run compared with the suite): the derived values spec.json records (computed fields) are left out
        of validation, recomputed from the keys they derive from, and must equal what was recorded. Raises
        pydantic's ValidationError naming the key, for the keys themselves as model_validate does and for a derived
        value that its keys do not give."""
        derived = cls.model_computed_fields
        params = cls.model_validate({k: v for k, v in values.items() if k not in derived})
        wrong = [InitErrorDetails(type=_not_derived(getattr(params, key)), loc=(key,), input=values[key])
                 for key in derived if key in values and values[key] != getattr(params, key)]
        if wrong:
            raise ValidationError.from_exception_data(cls.__name__, wrong)
        return params
