"""The training budget a workload suggests and a suite sets: step, epoch and time limits, eval cadence, targets."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

CADENCES = ("eval_every_epochs", "eval_every_seconds", "eval_every_steps")
TARGETS = ("target_accuracy", "target_loss")


class Budget(BaseModel):
    """When a run stops (whichever limit comes first) and how often it is evaluated."""

    # strict: TOML has real types, so "10" or true where a number belongs is an error, never converted (an int
    # where a float belongs, max_epochs = 10, is still accepted: pydantic's strict mode allows int for float).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    max_epochs: float | None = Field(default=None, gt=0)
    max_steps: int | None = Field(default=None, gt=0)
    max_train_seconds: float | None = Field(default=None, gt=0)
    eval_every_epochs: float | None = Field(default=None, gt=0)
    eval_every_seconds: float | None = Field(default=None, gt=0)
    eval_every_steps: int | None = Field(default=None, gt=0)
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    #: Time to target by held-out loss instead (lower is better: the first evaluation at or below it).
    target_loss: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_eval_cadence(self) -> Budget:
        cadences = [k for k in CADENCES if getattr(self, k) is not None]
        if len(cadences) > 1:
            raise ValueError(f"give one of {', '.join(CADENCES)}, not {' and '.join(cadences)}")
        if self.target_accuracy is not None and self.target_loss is not None:
            raise ValueError("give target_accuracy or target_loss, not both")
        return self

    def over(self, base: Budget) -> Budget:
        """This budget with every unset (None) field taken from `base`; a cadence set here replaces base's."""
        mine = {k: v for k, v in self.model_dump().items() if v is not None}
        merged = base.model_dump()
        for group in (CADENCES, TARGETS):  # one of each group: the suite's choice replaces the workload's
            if any(k in mine for k in group):
                merged.update(dict.fromkeys(group))
        merged.update(mine)
        return Budget(**merged)
