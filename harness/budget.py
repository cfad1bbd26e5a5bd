"""The training budget a workload suggests and a suite sets: step, epoch and time limits, eval cadence, target."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    target_accuracy: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _one_eval_cadence(self) -> Budget:
        if self.eval_every_epochs is not None and self.eval_every_seconds is not None:
            raise ValueError("give eval_every_epochs or eval_every_seconds, not both")
        return self

    def over(self, base: Budget) -> Budget:
        """This budget with every unset (None) field taken from `base`; a cadence set here replaces base's."""
        mine = {k: v for k, v in self.model_dump().items() if v is not None}
        merged = base.model_dump()
        if "eval_every_epochs" in mine:
            merged["eval_every_seconds"] = None
        if "eval_every_seconds" in mine:
            merged["eval_every_epochs"] = None
        merged.update(mine)
        return Budget(**merged)
