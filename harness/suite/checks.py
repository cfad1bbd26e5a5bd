"""The rules a resolved run must meet before anything runs, one set (check_run) for suite validation (expand_suite)
and `dtbench rerun` (check_spec): each names the field at fault as the run spec spells it ('world_size',
'params.batch_size'); each caller turns that into its file's field ('run[2].params.batch_size', 'defaults.lr')."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from harness.budget import Budget
from harness.run.lr_schedule import schedule_problem
from harness.suite.files import error_parts

#: A run whose threads (world size x threads per rank) outnumber the cores available this many times over is
#: refused: its times would measure the scheduler, not the method. Any oversubscription below it is a warning.
ABSURD_OVERSUBSCRIPTION = 64

#: Which check found a problem, for the caller's wording: the workload's `options`, `method`'s rules of world size
#: and params, `model`'s cut of the workload's blocks, the rank `layout` (nodes, threads, CPU lists), the `budget`,
#: the lr `schedule` against it, the `batch` against the data and its split, and the `host` the ranks run on.
Check = Literal["options", "method", "model", "layout", "budget", "schedule", "batch", "host"]


@dataclass(frozen=True)
class Problem:
    """Why a run cannot run: `field` as the run spec names it ('world_size', 'cpus_per_rank', 'budget',
    'params.<key>', or 'workload_options' for options that make no model), `message` one line, and `check` which
    rule found it."""

    field: str
    message: str
    check: Check


@dataclass(frozen=True)
class Host:
    """The machine a local run's ranks run on: the CPU ids this process may run on (os.sched_getaffinity, which a
    container's or a cgroup's CPU set narrows; every rank's affinity must lie in it)."""

    cpus: frozenset[int]

    @classmethod
    def here(cls) -> Host:
        if hasattr(os, "sched_getaffinity"):
            return cls(frozenset(os.sched_getaffinity(0)))
        return cls(frozenset(range(os.cpu_count() or 1)))  # pragma: no cover (no affinity API: macOS)

    @property
    def cores(self) -> int:
        return len(self.cpus)

    @property
    def cpus_text(self) -> str:
        """The CPU ids as ranges: '0-1', '0-3,8'."""
        ids, spans = sorted(self.cpus), []
        for cpu in ids:
            if spans and cpu == spans[-1][1] + 1:
                spans[-1][1] = cpu
            else:
                spans.append([cpu, cpu])
        return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


@dataclass(frozen=True)
class RunShape:
    """What the checks read of one resolved run: its method class and validated Params, the workload (a
    harness.workloads Workload) with its resolved options, and the layout and budget it runs with."""

    method_cls: Any
    params: Any
    world_size: int
    workload: Any
    options: dict[str, Any]
    threads: int | list[int]
    cpus: list[list[int]] | None
    nodes: int
    budget: Budget


@dataclass(frozen=True)
class Checked:
    """What check_run found: the workload options resolved (its Options' defaults filled in; as given when they
    do not validate), the first rule the run breaks or None, and the warning for a local run whose threads
    outnumber the cores (None when there is a problem)."""

    options: dict[str, Any]
    problem: Problem | None
    warning: str | None


def check_run(method_cls: Any, workload: Any, run: Mapping[str, Any], host: Host | None) -> Checked:
    """The one set of checks every run passes before anything runs, for a suite's runs (expand_suite) and a
    spec.json's (check_spec) alike: `run` holds RunSpec's fields (a RunSpec's own, or those expand_suite is
    building) with `params` the method's validated Params. First the workload's options, strictly (every
    workload's, a plugin's too), then run_problem's rules, then oversubscription's warning. `host`: this machine
    for a local run, None under SLURM."""
    options = run["workload_options"]
    try:
        options = workload.Options.model_validate(options, strict=True).model_dump()
    except ValidationError as exc:
        field, message = error_parts(exc, model=workload.Options)
        field = "workload_options" if field == "<top level>" else f"workload_options.{field}"
        return Checked(options, Problem(field, message, "options"), None)
    shape = RunShape(method_cls, run["params"], run["world_size"], workload, options, run["threads_per_rank"],
                     run["cpus_per_rank"], run["nodes"], run["budget"])
    problem = run_problem(shape, host)
    return Checked(options, problem, None if problem else oversubscription(shape, host))


def run_problem(run: RunShape, host: Host | None) -> Problem | None:
    """The first rule `run` breaks, or None. In order: the batch's split (a rank or microbatch under 1 sample),
    the method's world size and params, what it asks of the workload's model, nodes, the budget, the lr schedule
    against the budget, the global batch against the training set, the ranks' threads and CPU lists, and with a
    `host` (local runs; None under SLURM, whose nodes are not this machine) the CPUs and cores it has."""
    for check in (_batch_split, _method, _model, _nodes, _budget, _schedule, _training_set, _layout):
        problem = check(run)
        if problem is not None:
            return problem
    return host_problem(run, host) if host is not None else None


def _batch_split(run: RunShape) -> Problem | None:
    split = run.method_cls.batch_split(run.world_size, run.params)
    if split is None:
        return None
    parts, key, what = split
    if run.params.batch_size < parts:
        return Problem(f"params.{key}", f"batch_size {run.params.batch_size} cannot be cut into {parts} {what}: "
                       "each needs at least 1 sample", "batch")
    return None


def _method(run: RunShape) -> Problem | None:
    why = run.method_cls.check_world_size(run.world_size, run.params)
    return Problem("world_size", why, "method") if why else None


def _model(run: RunShape) -> Problem | None:
    """What the method asks of the workload's model, built on the meta device (workloads that give one)."""
    if getattr(run.workload, "make_model", None) is None:
        return None
    trouble: list[Problem] = []

    def model():
        try:
            return run.workload.meta_model(run.options)
        except ValueError as exc:
            trouble.append(Problem("workload_options", str(exc), "model"))
            raise

    try:
        found = run.method_cls.check_model(run.world_size, run.params, model)
    except ValueError:
        if trouble:
            return trouble[0]
        raise
    if found is None:
        return None
    key, why = found
    return Problem("world_size" if key == "world_size" else f"params.{key}", why, "model")


def _nodes(run: RunShape) -> Problem | None:
    if run.nodes < 1 or run.world_size % run.nodes:
        return Problem("nodes", f"{run.nodes} nodes do not divide world_size {run.world_size}", "layout")
    return None


def _budget(run: RunShape) -> Problem | None:
    b = run.budget
    if b.max_epochs is None and b.max_steps is None and b.max_train_seconds is None:
        return Problem("budget", "give at least one of max_epochs, max_steps, max_train_seconds", "budget")
    return None


def _schedule(run: RunShape) -> Problem | None:
    found = schedule_problem(run.params, run.budget.max_steps, run.budget.max_epochs)
    return Problem(f"params.{found[0]}", found[1], "schedule") if found else None


def _training_set(run: RunShape) -> Problem | None:
    """A step reads one global batch of distinct samples (harness/data/tensors.py DataOrder), so the batch may not
    outnumber the training set, where the workload knows its size without loading the data."""
    samples = run.workload.training_samples(run.options)
    if samples is not None and run.params.batch_size > samples:
        return Problem("params.batch_size", f"batch_size {run.params.batch_size} is larger than the training set of "
                       f"workload {run.workload.name!r} ({samples} samples); a step reads one batch of distinct "
                       "samples", "batch")
    return None


def _layout(run: RunShape) -> Problem | None:
    """A count >= 1 or one per rank; one non-empty list of CPU ids per rank."""
    threads, cpus, world_size = run.threads, run.cpus, run.world_size
    counts = threads if isinstance(threads, list) else [threads]
    if not counts or any(c < 1 for c in counts) or (isinstance(threads, list) and len(threads) != world_size):
        return Problem("threads_per_rank", f"give a count >= 1, or a list of one per rank ({world_size}), got "
                       f"{threads}", "layout")
    if cpus is not None and (len(cpus) != world_size or any(not c or min(c) < 0 for c in cpus)):
        return Problem("cpus_per_rank", f"give one non-empty list of CPU ids per rank ({world_size}), got {cpus}",
                       "layout")
    return None


def total_threads(threads: int | list[int], world_size: int) -> int:
    """Every rank's intra-op threads, summed."""
    return sum(threads) if isinstance(threads, list) else threads * world_size


def host_problem(run: RunShape, host: Host) -> Problem | None:
    """What this machine cannot give a local run: a CPU id outside the ones this process may run on, or threads
    more than ABSURD_OVERSUBSCRIPTION times its cores."""
    if run.cpus is not None:
        for rank, cpus in enumerate(run.cpus):
            missing = sorted(set(cpus) - host.cpus)
            if missing:
                return Problem("cpus_per_rank", f"rank {rank}'s CPU {missing[0]} is not one this machine lets "
                               f"dtbench run on (available: {host.cpus_text}, {host.cores} cores)", "host")
    total = total_threads(run.threads, run.world_size)
    if total > ABSURD_OVERSUBSCRIPTION * host.cores:
        field = "world_size" if run.world_size > ABSURD_OVERSUBSCRIPTION * host.cores else "threads_per_rank"
        return Problem(field, f"{_threads_text(run)} on {host.cores} cores is over {ABSURD_OVERSUBSCRIPTION}x "
                       "oversubscribed: its times would measure the scheduler; use fewer ranks or threads, or a "
                       "larger machine (--launcher slurm)", "host")
    return None


def oversubscription(run: RunShape, host: Host | None) -> str | None:
    """The warning for a local run whose threads outnumber the cores they may run on ('2 ranks x 2 threads = 4
    threads on 2 cores available: ...'), or None. With cpus_per_rank, sharing cores between ranks is the user's
    choice; a rank with more threads than its own CPUs is still warned about."""
    if host is None:
        return None
    if run.cpus is not None:
        for rank, cpus in enumerate(run.cpus):
            threads = run.threads[rank] if isinstance(run.threads, list) else run.threads
            if threads > len(set(cpus)):
                return (f"rank {rank} runs {threads} threads on {len(set(cpus))} CPU(s) {sorted(set(cpus))}: its "
                        "threads wait for each other, so its times measure that")
        return None
    total = total_threads(run.threads, run.world_size)
    if total > host.cores:
        return (f"{_threads_text(run)} on {host.cores} cores available: ranks share cores, so its times measure "
                "that sharing too")
    return None


def _threads_text(run: RunShape) -> str:
    total = total_threads(run.threads, run.world_size)
    each = f"{run.threads} threads" if isinstance(run.threads, list) else \
        f"{run.threads} thread{'s' if run.threads != 1 else ''}"
    return f"{run.world_size} rank{'s' if run.world_size != 1 else ''} x {each} = {total} threads"

