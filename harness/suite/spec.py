"""The values every part passes around: the fully resolved run spec, run ids and safe names."""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from harness.budget import Budget
from harness.bytesize import memory_text
from harness.net.spec import NetworkSpec
from harness.params import TrainParams

#: What suite names and run ids match (both are folder names under --out), and their longest length.
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_NAME = 128
#: The longest run id the suite makes (a folder name a person reads and types: the digest keeps it distinct).
MAX_RUN_ID = 80

#: The ranks' malloc policy (applied by harness/run/allocator.py). retain: glibc keeps what a step freed and the next
#: step reuses those pages; system: glibc's defaults, left as is.
Allocator = Literal["retain", "system"]


class RunSpec(BaseModel):
    """A fully resolved run: everything needed to execute it, written to spec.json.

    `method` and `workload` are as the suite named them: a registered name, or a `package.module:Class` reference.
    `method_origin` and `workload_origin` say where the registry found them (built-in, an installed package's entry
    point, or an import path), so a run folder alone says what code ran.

    `params` are the method's Params, typed: validated once, by the suite's expansion (expand_suite puts them here
    as it validated them) or when a spec.json is read (its params dict read as the method's Params, whose
    from_spec also reads an earlier spec.json's form), and passed on as they are to the ranks, which do not
    validate them again. They are written to spec.json as the Params dump them (computed fields too).
    """

    model_config = ConfigDict(extra="forbid")

    suite: str = Field(pattern=SAFE_NAME, max_length=MAX_NAME)  # both name folders under --out: never a path
    run_id: str = Field(pattern=SAFE_NAME, max_length=MAX_NAME)
    label: str
    method: str
    family: str
    workload: str
    workload_options: dict[str, Any]
    world_size: int = Field(ge=1)
    seed: int = Field(ge=0, lt=2**32)  # numpy's seed range
    params: TrainParams  # the method's Params (a TrainParams subclass)
    budget: Budget
    threads_per_rank: int | list[int]  # a list: rank r runs threads_per_rank[r] threads (heterogeneous ranks)
    deterministic: bool
    cpus_per_rank: list[list[int]] | None = None  # rank r runs on CPUs cpus_per_rank[r] (sched_setaffinity)
    log_every_steps: int = Field(ge=1)
    checkpoint_every_steps: int | None = Field(default=None, ge=1)
    hang_timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)  # no progress this long: torn down
    allocator: Allocator = "retain"  # the ranks' malloc policy (harness/run/allocator.py)
    nodes: int = 1
    data_root: str | None = None
    suite_file: str | None = None
    network: NetworkSpec | None = None
    method_origin: str | None = None
    workload_origin: str | None = None
    baseline: str | None = None  # the label or method this run's workload is compared against (suite or [[group]])
    memory_per_rank: int | None = Field(default=None, ge=1)  # emulated device memory of every rank, bytes

    @field_serializer("params")
    def _params_as_written(self, params: TrainParams) -> dict[str, Any]:
        """The Params as their own model_dump writes them (every field of the subclass, computed ones too), then
        written as JSON as any dict is: the spec.json (and the checkpoints' spec hash) of the dict they once were."""
        return params.model_dump()

    @model_validator(mode="before")
    @classmethod
    def _method_resolves(cls, data: Any) -> Any:
        """A spec.json's params are its method's: the method must resolve to read them (an error at `method`)."""
        if isinstance(data, dict) and isinstance(data.get("params"), dict) and isinstance(data.get("method"), str):
            try:
                _method_class(data["method"])
            except LookupError as exc:  # registry.RegistryError
                error = InitErrorDetails(type=PydanticCustomError("method", "{why}", {"why": str(exc)}),
                                         loc=("method",), input=data["method"])
                raise ValidationError.from_exception_data(cls.__name__, [error]) from None
        return data

    @field_validator("params", mode="before")
    @classmethod
    def _method_params(cls, value: Any, info: ValidationInfo) -> Any:
        """A spec.json's params (a dict) read as its method's Params (TrainParams.from_spec), their errors located
        under `params`; Params already validated (expand_suite's) kept as they are."""
        if isinstance(value, TrainParams) or not isinstance(value, dict) or "method" not in info.data:
            return value
        return _method_class(info.data["method"]).Params.from_spec(value)


def _method_class(name: str) -> Any:
    """The method class registered or referenced as `name`; registry.RegistryError (a LookupError) otherwise."""
    from harness import registry  # here: a spec's params are its method's code, which imports torch

    return registry.METHODS.get(name)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """`text` with every run of characters outside [A-Za-z0-9._-] replaced by '_' (a file name part; may be '')."""
    return _UNSAFE.sub("_", text)


def compact(value: Any) -> str:
    """A parameter value as run ids and labels show it: 0.05 -> '0.05', True -> '1', [2, 1] -> '2+1'."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return "+".join(compact(v) for v in value)
    return str(value)


def make_run_id(method: str, workload: str, world_size: int, params: dict[str, Any], seed: int,
                workload_options: dict[str, Any] | None = None, label: str | None = None,
                network: NetworkSpec | None = None, memory_per_rank: int | None = None) -> str:
    """A stable, human-readable, filesystem-safe id from what distinguishes a run.

    An emulated network adds `net<rate>` (and `lat<latency>`) before the seed, an emulated device memory
    `mem<bytes>` ('mem48MB', 'mem64MiB', or the byte count); ids of runs without them are as they always were.
    Characters outside [A-Za-z0-9._-] become '_'. When that changed anything, or the id is longer than
    MAX_RUN_ID (80) characters, it is cut to 71 and an 8-hex digest of the exact inputs is appended, so that distinct
    runs keep distinct ids and no id is longer than 80.
    """
    parts = [label or method, workload, f"w{world_size}"]
    parts += [f"{k}{compact(v)}" for k, v in sorted((workload_options or {}).items())]
    parts += [f"{k}{compact(v)}" for k, v in sorted(params.items())]
    if network is not None:
        parts.append(f"net{network.rate}" + (f"-lat{network.latency}" if network.latency else ""))
    if memory_per_rank is not None:
        parts.append(f"mem{memory_text(memory_per_rank)}")
    parts.append(f"s{seed}")
    raw = "-".join(parts)
    safe = safe_name(raw).strip("._-") or "run"
    if safe != raw or len(safe) > MAX_RUN_ID:
        inputs: list[Any] = [method, workload, world_size, params, seed, workload_options, label]
        if network is not None:  # only then: the digests of runs without a network stay as they were
            inputs.append(network.text)
        if memory_per_rank is not None:
            inputs.append(memory_per_rank)
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:8]
        safe = f"{safe[:MAX_RUN_ID - 9].rstrip('._-')}-{digest}"
    return safe


def rank_threads(threads_per_rank: int | list[int], rank: int) -> int:
    """The intra-op threads of `rank`."""
    return threads_per_rank[rank] if isinstance(threads_per_rank, list) else threads_per_rank


def default_threads(world_size: int) -> int:
    """Intra-op threads per rank: the machine's cores shared evenly, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world_size)
