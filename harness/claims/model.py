"""Claim files: the TOML schema of a paper's checkable statements, loaded with one-line errors (docs/claims.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.claims.sequential import MIN_SEEDS, Design, looks_up_to
from harness.report.tables import EXTRA_COLUMNS, MORE_COLUMNS, SUMMARY_COLUMNS
from harness.suite.files import FileError, load_toml

#: summary.csv columns that are not numbers, so no claim can be about them.
TEXT_COLUMNS = ("suite", "run_id", "method", "workload", "state", "label", "family", "network", "noisy")
#: The columns a claim's `metric` may name: every numeric column of summary.csv.
METRIC_COLUMNS = tuple(c for c in (*SUMMARY_COLUMNS, *EXTRA_COLUMNS, *MORE_COLUMNS) if c not in TEXT_COLUMNS)
Relation = Literal["ratio_le", "ratio_ge", "diff_le", "diff_ge", "absdiff_le"]
#: What a claim's verdict is: evidence from training; a design check (a value the implementation fixes, such as a
#: payload layout, whatever training does: shown apart, never counted as evidence); or a statement this machine kind
#: cannot decide (the paper's regime needs a cluster: measured and shown apart, its verdict always INCONCLUSIVE).
Kind = Literal["evidence", "design", "cluster"]


class Claim(BaseModel):
    """One `[[claim]]`: a paper's statement about `metric` of `method` against `baseline`.

    relation: ratio_le (mean(method) / mean(baseline) <= value), ratio_ge (>=), diff_le (mean(method - baseline)
    <= value), diff_ge (>=) or absdiff_le (|mean(method - baseline)| <= value: two-sided, for transparency), over
    seeds paired by (workload, network, seed). `setting` says whether the suite reproduces the paper's setting or a
    scaled-down one; `note` how the statement was read into a number; `kind` whether the verdict is evidence, a
    design check or needs a cluster (Kind), and `why`, for the last two, what fixes the value or what the cluster
    gives that this machine does not. `requires` names the claims that must PASS for this one's PASS to count.
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    source: str = Field(min_length=1, description="the paper and where in it, e.g. 'Lin et al. 2018, Table 3'")
    statement: str = Field(min_length=1, description="what the paper says, in one sentence")
    setting: Literal["paper", "scaled-down"]
    note: str = ""
    metric: str
    method: str = Field(min_length=1, description="a label (without ' @ network'), a full label or a method name")
    baseline: str = Field(min_length=1)
    relation: Relation
    value: float
    kind: Kind = "evidence"
    why: str = Field(default="", description="design: what fixes the value; cluster: why it cannot pass here")
    requires: list[str] = Field(default_factory=list, description="ids of claims in this file that must PASS for "
                                "this one's PASS to count: the control that shows it passes for the paper's reason "
                                "(pb matches sgd *because of* SC and LWP only where pb without them is worse)")

    @field_validator("metric")
    @classmethod
    def _summary_column(cls, value: str) -> str:
        if value not in METRIC_COLUMNS:
            raise ValueError(f"not a numeric summary.csv column (columns: {', '.join(METRIC_COLUMNS)})")
        return value

    @field_validator("value")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @model_validator(mode="after")
    def _why_for_non_evidence(self) -> Claim:
        if self.kind != "evidence" and not self.why.strip():
            raise ValueError(f"why: required for kind = {self.kind!r} (what fixes the value, or why it needs a "
                             "cluster)")
        if self.relation == "absdiff_le" and self.value < 0:
            raise ValueError("value: absdiff_le needs a tolerance >= 0")
        return self


class Sequential(BaseModel):
    """`[sequential]`: seeds are added to undecided claims (`dtbench claims --until-decided`) up to `max_seeds`, and
    every judgement of the file looks at its seeds as the design says (harness/claims/sequential.py): at `looks`
    seeds (default: doubling from 3, ending at max_seeds), each with its Bonferroni share of the error."""

    model_config = ConfigDict(extra="forbid")

    max_seeds: int = Field(ge=MIN_SEEDS, le=1000)
    looks: list[int] | None = Field(default=None, description="the seed counts judged, increasing, from at least "
                                    f"{MIN_SEEDS} to max_seeds")

    @model_validator(mode="after")
    def _looks_end_at_max(self) -> Sequential:
        if self.looks is not None:
            if not self.looks or self.looks[0] < MIN_SEEDS or self.looks[-1] != self.max_seeds or any(
                    b <= a for a, b in zip(self.looks, self.looks[1:], strict=False)):
                raise ValueError(f"looks: must increase from at least {MIN_SEEDS} and end at max_seeds "
                                 f"({self.max_seeds}), not {self.looks}")
        return self

    def design(self) -> Design:
        return Design(tuple(self.looks) if self.looks is not None else looks_up_to(self.max_seeds))


class ClaimFile(BaseModel):
    """A claim file: optionally the suite it is meant for and its sequential design, and its claims."""

    model_config = ConfigDict(extra="forbid")

    suite: str | None = Field(default=None, description="the suite name the claims are about (checked when set)")
    sequential: Sequential | None = None
    claim: list[Claim] = Field(min_length=1)

    def design(self) -> Design | None:
        """The file's sequential design; None: one look at every pair."""
        return self.sequential.design() if self.sequential is not None else None


def load_claims(path: str | Path) -> ClaimFile:
    """Parse and validate a claim file. Raises FileError with one line naming the file and the field."""
    claims, _ = load_toml(path, ClaimFile, "claim file")
    seen: dict[str, int] = {}
    for i, claim in enumerate(claims.claim):
        if claim.id in seen:
            raise FileError(f"{path}: claim[{i}].id: {claim.id!r} is also the id of claim[{seen[claim.id]}]")
        seen[claim.id] = i
    for i, claim in enumerate(claims.claim):
        for name in claim.requires:
            if name not in seen or name == claim.id:
                raise FileError(f"{path}: claim[{i}].requires: {name!r} is not the id of another claim in the file")
    return claims
