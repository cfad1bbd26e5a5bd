"""Suite files: the pydantic schema over the TOML contract and its expansion into fully resolved run specs."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.network import NetworkSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SuiteError(Exception):
    """A suite file is invalid. The message is one line naming the file and the field."""


class Budget(BaseModel):
    """When a run stops (whichever limit comes first) and how often it is evaluated."""

    model_config = ConfigDict(extra="forbid")

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


class RunEntry(BaseModel):
    """One `[[run]]` table of a suite file."""

    model_config = ConfigDict(extra="forbid")

    method: str
    world_size: int = Field(default=1, ge=1)
    workload: str | None = None
    workload_options: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None
    threads_per_rank: int | None = Field(default=None, ge=1)
    budget: Budget | None = None
    nodes: int | None = Field(default=None, ge=1)
    network: NetworkSpec | None = None


class SuiteFile(BaseModel):
    """The top level of a suite file (see docs/suites.md)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    workload: str
    workload_options: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    budget: Budget = Field(default_factory=Budget)
    defaults: dict[str, Any] = Field(default_factory=dict)
    threads_per_rank: int | None = Field(default=None, ge=1)
    deterministic: bool = True
    log_every_steps: int = Field(default=1, ge=1)
    checkpoint_every_steps: int | None = Field(default=None, ge=1)
    nodes: int = Field(default=1, ge=1, description="SLURM nodes per run; world_size / nodes tasks on each")
    data_root: str | None = None
    network: NetworkSpec | None = None
    run: list[RunEntry] = Field(min_length=1)


class RunSpec(BaseModel):
    """A fully resolved run: everything needed to execute it, written to spec.json."""

    model_config = ConfigDict(extra="forbid")

    suite: str
    run_id: str
    label: str
    method: str
    family: str
    workload: str
    workload_options: dict[str, Any]
    world_size: int
    seed: int
    params: dict[str, Any]
    budget: Budget
    threads_per_rank: int
    deterministic: bool
    log_every_steps: int
    checkpoint_every_steps: int | None = None
    nodes: int = 1
    data_root: str | None = None
    suite_file: str | None = None
    network: NetworkSpec | None = None


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _compact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return "+".join(_compact(v) for v in value)
    return str(value)


def make_run_id(method: str, workload: str, world_size: int, params: dict[str, Any], seed: int,
                workload_options: dict[str, Any] | None = None, label: str | None = None,
                network: NetworkSpec | None = None) -> str:
    """A stable, human-readable, filesystem-safe id from what distinguishes a run.

    An emulated network adds `net<rate>` (and `lat<latency>`) before the seed; ids of runs without one are as they
    always were. Characters outside [A-Za-z0-9._-] become '_'. When that changed anything, or the id is longer than
    120 characters, an 8-hex digest of the exact inputs is appended so that distinct runs keep distinct ids.
    """
    parts = [label or method, workload, f"w{world_size}"]
    parts += [f"{k}{_compact(v)}" for k, v in sorted((workload_options or {}).items())]
    parts += [f"{k}{_compact(v)}" for k, v in sorted(params.items())]
    if network is not None:
        parts.append(f"net{network.rate}" + (f"-lat{network.latency}" if network.latency else ""))
    parts.append(f"s{seed}")
    raw = "-".join(parts)
    safe = _UNSAFE.sub("_", raw).strip("._-") or "run"
    if safe != raw or len(safe) > 120:
        inputs: list[Any] = [method, workload, world_size, params, seed, workload_options, label]
        if network is not None:  # only then: the digests of runs without a network stay as they were
            inputs.append(network.text)
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:8]
        safe = f"{safe[:110]}-{digest}"
    return safe


def _field_path(loc: tuple[Any, ...], doc: dict[str, Any]) -> str:
    """Turn a pydantic error location into the TOML path a user reads: run[2].params.bits."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top level>"


def _first_error(path: Path, err: ValidationError, doc: dict[str, Any], prefix: str = "") -> SuiteError:
    e = err.errors()[0]
    loc = tuple(x for x in e["loc"] if x not in ("function-after",))
    field = _field_path(loc, doc)
    if prefix:
        field = f"{prefix}.{field}" if field != "<top level>" else prefix
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    elif e["type"] == "missing":
        msg = "required key is missing"
    elif "input" in e and e["type"] not in ("value_error",):
        msg = f"{msg} (got {e['input']!r})"
    return SuiteError(f"{path}: {field}: {msg}")


def load_suite_file(path: str | Path) -> tuple[SuiteFile, dict[str, Any]]:
    """Parse and validate the top level of a suite file. Raises SuiteError with one line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read suite file: {exc.strerror or exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    try:
        return SuiteFile.model_validate(doc), doc
    except ValidationError as exc:
        raise _first_error(path, exc, doc) from None


def expand_suite(path: str | Path, only: str | None = None, network: NetworkSpec | None = None) -> list[RunSpec]:
    """Validate a suite file and expand it into one RunSpec per run and seed.

    Checks every method name, workload name, method and workload parameter, and world size. Any problem raises
    SuiteError naming the file and the field; nothing is written by this function. `network` (from --network)
    replaces the suite's and every run's network.
    """
    from harness import workloads
    from methods import registry

    path = Path(path)
    suite, _doc = load_suite_file(path)
    specs: list[RunSpec] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(suite.run):
        where = f"run[{i}]"
        try:
            method_cls = registry.get(entry.method)
        except KeyError:
            raise SuiteError(f"{path}: {where}.method: unknown method {entry.method!r} "
                             f"(known: {', '.join(registry.names())})") from None
        workload_name = entry.workload or suite.workload
        try:
            workload = workloads.get(workload_name)
        except KeyError:
            field = f"{where}.workload" if entry.workload else "workload"
            raise SuiteError(f"{path}: {field}: unknown workload {workload_name!r} "
                             f"(known: {', '.join(workloads.names())})") from None
        options = {**(suite.workload_options if not entry.workload else {}), **entry.workload_options}
        try:
            resolved_options = workload.Options.model_validate(options).model_dump()
        except ValidationError as exc:
            raise _first_error(path, exc, {}, prefix=f"{where}.workload_options") from None

        # Precedence: method defaults < workload defaults < suite [defaults] < run params.
        for key in suite.defaults:
            if key not in method_cls.Params.model_fields:
                raise SuiteError(f"{path}: defaults.{key}: not a parameter of method {entry.method!r} "
                                 f"used by {where} (its parameters: {', '.join(method_cls.Params.model_fields)})")
        merged = {k: v for k, v in workload.hyperparameters.items() if k in method_cls.Params.model_fields}
        merged.update(suite.defaults)
        merged.update(entry.params)
        try:
            params = method_cls.Params.model_validate(merged)
        except ValidationError as exc:
            e = exc.errors()[0]
            key = str(e["loc"][0]) if e["loc"] else ""
            origin = f"{where}.params" if key in entry.params or not key else (
                "defaults" if key in suite.defaults else f"{where}.params")
            raise _first_error(path, exc, {}, prefix=origin if key else f"{where}.params") from None
        problem = method_cls.check_world_size(entry.world_size, params)
        if problem:
            raise SuiteError(f"{path}: {where}.world_size: {problem}")
        nodes = entry.nodes or suite.nodes
        if entry.world_size % nodes:
            raise SuiteError(f"{path}: {where + '.nodes' if entry.nodes else 'nodes'}: world_size "
                             f"{entry.world_size} of {where} is not divisible by {nodes} nodes")

        budget = (entry.budget.over(suite.budget) if entry.budget else suite.budget).over(workload.budget)
        if budget.max_epochs is None and budget.max_steps is None and budget.max_train_seconds is None:
            raise SuiteError(f"{path}: budget: give at least one of max_epochs, max_steps, max_train_seconds")
        threads = entry.threads_per_rank or suite.threads_per_rank or default_threads(entry.world_size)
        run_network = network or entry.network or suite.network
        label = entry.label or default_label(entry)
        if run_network is not None:
            label += f" @ {run_network.text}"
        for seed in suite.seeds:
            run_id = make_run_id(entry.method, workload_name, entry.world_size, entry.params, seed,
                                 entry.workload_options, entry.label, run_network)
            if run_id in seen:
                raise SuiteError(f"{path}: {where}: duplicates {seen[run_id]} (same method, workload, world size, "
                                 f"params, network and seed); give it a distinct label")
            seen[run_id] = where
            specs.append(RunSpec(
                suite=suite.name, run_id=run_id, label=label, method=entry.method,
                family=method_cls.family, workload=workload_name, workload_options=resolved_options,
                world_size=entry.world_size, seed=seed, params=params.model_dump(), budget=budget,
                threads_per_rank=threads, deterministic=suite.deterministic,
                log_every_steps=suite.log_every_steps, checkpoint_every_steps=suite.checkpoint_every_steps,
                nodes=nodes, data_root=suite.data_root, suite_file=str(path.resolve()), network=run_network,
            ))
    if only:
        specs = [s for s in specs if fnmatch.fnmatchcase(s.run_id, only)]
    return specs


def default_label(entry: RunEntry) -> str:
    """How a run group is named in reports: the method, its explicit params and world size."""
    extra = " ".join(f"{k}={_compact(v)}" for k, v in sorted(entry.params.items()))
    return f"{entry.method}{' ' + extra if extra else ''} x{entry.world_size}"


def default_threads(world_size: int) -> int:
    """Intra-op threads per rank: the machine's cores shared evenly, at least one."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world_size)
