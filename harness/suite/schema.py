"""The suite file's schema: its top level, its [[run]]s and its [[group]]s, as pydantic models over the TOML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from harness.budget import Budget
from harness.net.spec import NetworkSpec
from harness.suite.files import load_toml
from harness.suite.spec import MAX_NAME, SAFE_NAME, Allocator

#: A seed: numpy's seed range (np.random.seed takes 0 <= seed < 2**32).
Seed = Annotated[int, Field(ge=0, lt=2**32)]


class RunEntry(BaseModel):
    """One `[[run]]` table of a suite file."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: world_size = "2" is an error, as in Budget

    method: str
    world_size: int = Field(default=1, ge=1)
    workload: str | None = None
    workload_options: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None
    threads_per_rank: int | list[int] | None = Field(default=None, description="one count for every rank, or one "
                                                     "per rank (a heterogeneous set-up)")
    cpus_per_rank: list[list[int]] | None = Field(default=None, description="the CPUs each rank may run on (local "
                                                  "launcher), e.g. [[0], [1], [1]]: two ranks share a core")
    budget: Budget | None = None
    nodes: int | None = Field(default=None, ge=1)
    hang_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False, strict=True)
    allocator: Allocator | None = None
    network: NetworkSpec | None = None
    memory_per_rank: int | str | None = Field(default=None, description="emulated device memory of each of the "
                                              "run's ranks: bytes, or a string such as '48MB' (over the suite's)")


class GroupEntry(BaseModel):
    """One `[[group]]` table of a suite file: runs that share a workload, its options, a budget and defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    workload: str
    workload_options: dict[str, Any] = Field(default_factory=dict, description="under each run's own")
    budget: Budget | None = Field(default=None, description="over the suite's [budget], under each run's own")
    defaults: dict[str, Any] = Field(default_factory=dict, description="over the suite's [defaults], under each "
                                     "run's params")
    baseline: str | None = Field(default=None, description="the label or method of one of the group's runs that "
                                 "the others are compared against")
    run: list[RunEntry] = Field(min_length=1)


class SuiteFile(BaseModel):
    """The top level of a suite file (see docs/suites.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=SAFE_NAME, max_length=MAX_NAME)
    workload: str | None = Field(default=None, description="the workload of every top-level [[run]] that names "
                                 "none; required when one does not")
    workload_options: dict[str, Any] = Field(default_factory=dict)
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1)
    budget: Budget = Field(default_factory=Budget)
    defaults: dict[str, Any] = Field(default_factory=dict)
    threads_per_rank: int | None = Field(default=None, ge=1)
    deterministic: bool = True
    log_every_steps: int = Field(default=1, ge=1)
    checkpoint_every_steps: int | None = Field(default=None, ge=1)
    hang_timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False, strict=True,
                                  description="seconds a run's ranks may make no progress before it is torn "
                                  "down and failed (docs/suites.md)")
    allocator: Allocator = Field(default="retain", description="the ranks' malloc policy: 'retain' keeps freed "
                                 "memory mapped for the next step, 'system' leaves the C library's defaults")
    nodes: int = Field(default=1, ge=1, description="SLURM nodes per run; world_size / nodes tasks on each")
    data_root: str | None = None
    network: NetworkSpec | None = None
    memory_per_rank: int | str | None = Field(default=None, description="emulated device memory of every rank: "
                                              "bytes, or a string such as '48MB'; a run whose planned bytes exceed "
                                              "it stops before its first step as does_not_fit")
    baseline: str | None = Field(default=None, description="the label or method of one of the top-level runs "
                                 "that the others are compared against")
    run: list[RunEntry] = Field(default_factory=list, description="at least one run in all, here or in groups")
    group: list[GroupEntry] = Field(default_factory=list)


def load_suite_file(path: str | Path) -> tuple[SuiteFile, dict[str, Any]]:
    """Parse and validate the top level of a suite file. Raises FileError with one line."""
    return load_toml(path, SuiteFile, "suite file")
