"""Suite files expanded: every run of a suite file validated and resolved into run specs, one per seed."""

from __future__ import annotations

import difflib
import fnmatch
import warnings
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import registry
from harness.bytesize import parse_bytes
from harness.net.spec import NetworkSpec
from harness.suite.checks import Host, Problem, check_run
from harness.suite.files import FileError, first_error
from harness.suite.groups import PlacedRun, check_baseline, placed_runs
from harness.suite.labels import LabelInputs, default_labels
from harness.suite.schema import GroupEntry, RunEntry, SuiteFile, load_suite_file  # noqa: F401 (re-exported)
from harness.suite.spec import RunSpec, default_threads, make_run_id


def _lookup(path: Path, field: str, kind: registry.Registry, name: str):
    """(object, entry) registered or referenced as `name`; FileError naming the field otherwise."""
    try:
        return kind.resolve(name)
    except registry.RegistryError as exc:
        raise FileError(f"{path}: {field}: {exc}") from None


def expand_suite(path: str | Path, only: str | None = None, network: NetworkSpec | None = None,
                 launcher: str = "local", seeds: list[int] | None = None) -> list[RunSpec]:
    """Validate a suite file and expand it into one RunSpec per run and seed, in file order: the top-level [[run]]s,
    then each [[group]]'s runs (harness/suite/groups.py), each once per seed.

    Checks every method name, workload name, method and workload parameter, world size, and the rules of
    harness/suite/checks.py: the stages or chunks a method asks of the workload's blocks (without data: the model on
    the meta device), the batch against the training set and its split, the budget, the ranks' layout, and for the
    local `launcher` this machine's CPUs (warning once per run whose threads outnumber its cores; `launcher`
    "slurm": the cluster's nodes are not this machine, so none of that). Any problem raises FileError naming the
    file and the field; nothing is written by this function. `network` (from --network) replaces the suite's and
    every run's network; `seeds` (from --seeds, or the seeds `dtbench claims --until-decided` adds) the suite's
    seeds.
    """
    path = Path(path)
    host = Host.here() if launcher == "local" else None
    suite, _doc = load_suite_file(path)
    if suite.workload is not None:
        _lookup(path, "workload", registry.WORKLOADS, suite.workload)
    elif suite.workload_options:
        raise FileError(f"{path}: workload_options: options of the suite's workload, but the suite names none")
    specs: list[RunSpec] = []
    resolved: list[tuple[PlacedRun, Any, str, str, dict[str, Any]]] = []  # each run, before its label and seeds
    for placed in placed_runs(path, suite):
        entry, where = placed.entry, placed.where
        method_cls, method_entry = _lookup(path, f"{where}.method", registry.METHODS, entry.method)
        workload_name = entry.workload or suite.workload
        if workload_name is None:
            raise FileError(f"{path}: {where}.workload: required key is missing (the suite names no workload)")
        workload, workload_entry = _lookup(path, placed.workload_field, registry.WORKLOADS, workload_name)
        options = {**(suite.workload_options if not entry.workload else {}), **entry.workload_options}

        # Precedence: method defaults < workload defaults < suite [defaults] < group defaults < run params (a
        # group's defaults are folded into entry.params by placed_runs).
        fields = method_cls.Params.model_fields
        layers = [("defaults", suite.defaults)]
        if placed.group_entry is not None:
            layers.append((f"{placed.group}.defaults", placed.group_entry.defaults))
        derived = method_cls.Params.model_computed_fields  # recorded in spec.json, computed from the others
        for field, values in [*layers, (f"{where}.params", entry.params)]:
            for key in values:
                if key in derived:
                    raise FileError(f"{path}: {field}.{key}: derived by method {entry.method!r} from its other "
                                    f"parameters, not set ({derived[key].description})")
        for field, values in layers:  # the run's own params: pydantic's unknown key below, with the nearest
            for key in values:
                if key not in fields:
                    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.8)
                    hint = f"did you mean {close[0]}? " if close else ""
                    raise FileError(f"{path}: {field}.{key}: not a parameter of method {entry.method!r} used by "
                                    f"{where} ({hint}its parameters: {', '.join(fields)})")
        merged = {k: v for k, v in workload.hyperparameters.items() if k in fields}
        merged.update(suite.defaults)
        merged.update(entry.params)
        try:  # the one validation of the run's params: the RunSpecs hold this object, and the ranks get it
            params = method_cls.Params.model_validate(merged)
        except ValidationError as exc:
            key = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
            error = first_error(path, exc, prefix=placed.param_field(key, suite.defaults), model=method_cls.Params)
            raise FileError(f"{error} (run {where}, method {entry.method!r})") from None
        threads = entry.threads_per_rank if entry.threads_per_rank is not None else suite.threads_per_rank
        if threads is None:  # not `or`: a run's 0 or [] is an error below, not "unset"
            threads = default_threads(entry.world_size)
        memory_field = f"{where}.memory_per_rank" if entry.memory_per_rank is not None else "memory_per_rank"
        memory_value = entry.memory_per_rank if entry.memory_per_rank is not None else suite.memory_per_rank
        try:
            memory_per_rank = None if memory_value is None else parse_bytes(memory_value)
        except ValueError as exc:
            raise FileError(f"{path}: {memory_field}: {exc}") from None
        spec_fields = dict(
            suite=suite.name, method=entry.method, family=method_cls.family, workload=workload_name,
            workload_options=options, world_size=entry.world_size, params=params,
            budget=(entry.budget.over(suite.budget) if entry.budget else suite.budget).over(workload.budget),
            threads_per_rank=threads, cpus_per_rank=entry.cpus_per_rank, deterministic=suite.deterministic,
            log_every_steps=suite.log_every_steps, checkpoint_every_steps=suite.checkpoint_every_steps,
            hang_timeout_s=entry.hang_timeout_s or suite.hang_timeout_s, allocator=entry.allocator or suite.allocator,
            nodes=entry.nodes or suite.nodes, data_root=suite.data_root, suite_file=str(path.resolve()),
            network=network or entry.network or suite.network, method_origin=method_entry.origin,
            workload_origin=workload_entry.origin, memory_per_rank=memory_per_rank,
            baseline=placed.group_entry.baseline if placed.group_entry is not None else suite.baseline)
        checked = check_run(method_cls, workload, spec_fields, host)
        if checked.problem:
            raise FileError(f"{path}: {_field_of(checked.problem, placed, suite)}: {checked.problem.message}"
                            f"{_context(checked.problem, placed, workload_name)}")
        if checked.warning:
            warnings.warn(f"{path}: {where} ({entry.method}): {checked.warning}", stacklevel=2)
        spec_fields["workload_options"] = checked.options
        resolved.append((placed, method_cls, method_entry.id_name, workload_entry.id_name, spec_fields))

    optimizer = suite.defaults.get("optimizer")  # None: the most common among the suite's runs
    labels = default_labels([label_inputs(cls.name, fields) for _p, cls, _m, _w, fields in resolved], optimizer)
    baselines: dict[str, list[tuple[str, str, set[str]]]] = {}  # 'baseline' or 'group[i].baseline' -> its runs
    seen: dict[str, str] = {}
    for (placed, method_cls, method_id, workload_id, fields), default in zip(resolved, labels, strict=True):
        entry, where = placed.entry, placed.where
        label = entry.label or default
        baseline_field = f"{placed.group}.baseline" if placed.group_entry is not None else "baseline"
        names = {label, entry.method, method_cls.name}  # what a baseline may name: the label or the method
        baselines.setdefault(baseline_field, []).append((label, method_cls.name, names))
        if fields["network"] is not None:
            label += f" @ {fields['network'].text}"
        for seed in suite.seeds if seeds is None else seeds:
            run_id = make_run_id(method_id, workload_id, entry.world_size, entry.params, seed,
                                 entry.workload_options, entry.label, fields["network"], fields["memory_per_rank"])
            if run_id in seen:
                raise FileError(f"{path}: {where}: duplicates {seen[run_id]} (same method, workload, world size, "
                                f"params, network and seed); give it a distinct label")
            seen[run_id] = where
            specs.append(RunSpec(run_id=run_id, label=label, seed=seed, **fields))
    _check_labels(path, [(placed.where, fields["workload"], placed.entry.label or label, fields["network"])
                         for (placed, *_rest, fields), label in zip(resolved, labels, strict=True)])
    check_baseline(path, "baseline", suite.baseline, baselines.get("baseline", []))
    for g, group in enumerate(suite.group):
        check_baseline(path, f"group[{g}].baseline", group.baseline, baselines[f"group[{g}].baseline"])
    if only:
        specs = [s for s in specs if fnmatch.fnmatchcase(s.run_id, only)]
    return specs


def _field_of(problem: Problem, placed: PlacedRun, suite: SuiteFile) -> str:
    """The suite file's field that set what `problem` (harness/suite/checks.py) names: a parameter where the run,
    its group or [defaults] set it; a layout key where the run set it, else the suite's top-level key."""
    where, entry = placed.where, placed.entry
    if problem.field.startswith("params."):
        key = problem.field.removeprefix("params.")
        fallback = "defaults" if problem.check == "schedule" else None
        return f"{placed.param_field(key, suite.defaults, fallback=fallback)}.{key}"
    if problem.field == "workload_options":
        return placed.options_field
    if problem.check == "options":  # workload_options.<key>[...]: where the key was set
        key = problem.field.removeprefix("workload_options.")
        option = key.split(".")[0].split("[")[0]
        return f"{placed.option_field(option)}.{key}"
    if problem.field == "nodes":
        return f"{where}.nodes" if entry.nodes else "nodes"
    if problem.field == "threads_per_rank" and entry.threads_per_rank is None and suite.threads_per_rank is not None:
        return "threads_per_rank"
    if problem.field == "budget":
        return "budget"
    return f"{where}.{problem.field}"


def _context(problem: Problem, placed: PlacedRun, workload: str) -> str:
    """What a suite's error adds after the problem: the method, or the workload whose model or data is too small."""
    method = placed.entry.method
    if problem.check == "method":
        return f" (method {method!r})"
    if problem.check == "model":
        return f" (workload {workload!r})"
    if problem.check in ("schedule", "batch"):
        return f" (run {placed.where}, method {method!r})"
    if problem.field == "nodes" and not placed.entry.nodes:  # the suite's key: say which run it does not fit
        return f" (run {placed.where})"
    return ""


def label_inputs(method_name: str, fields: dict[str, Any]) -> LabelInputs:
    """What may set a run (its RunSpec fields but label, id and seed) apart from its method's other runs: params,
    workload options (named `options.<key>` where a param has the key), budget, layout and allocator."""
    settings = fields["params"].model_dump()
    for key, value in fields["workload_options"].items():
        settings[f"options.{key}" if key in settings else key] = value
    for key, value in fields["budget"].model_dump(exclude_none=True).items():
        settings.setdefault(key, value)
    settings.update(threads=fields["threads_per_rank"], cpus=fields["cpus_per_rank"], nodes=fields["nodes"],
                    allocator=fields["allocator"])
    return LabelInputs(method_name, fields["workload"], fields["world_size"], settings)


def _check_labels(path: Path, runs: list[tuple[str, str, str, NetworkSpec | None]]) -> None:
    """Each (where, workload, label, network) names a distinct run: two runs under one label on one workload and
    network would be read by the report as seeds of one. Raises FileError naming the second run's label."""
    first: dict[tuple[str, str, str | None], str] = {}
    for where, workload, label, network in runs:
        key = (workload, label, network.text if network is not None else None)
        if key in first:
            raise FileError(f"{path}: {where}.label: {label!r} also names {first[key]} on workload {workload!r}; "
                            "give one of them a distinct label")
        first[key] = where


def check_spec(spec: RunSpec, path: str | Path) -> RunSpec:
    """Check a run spec read back from a spec.json (`dtbench rerun`, which runs locally) with the checks every
    suite's run passes (check_run, harness/suite/checks.py): the workload resolves and its options validate, and
    the world size, model, nodes, budget, batch, threads and this machine's CPUs fit (a warning when its threads
    outnumber the cores). Its method and params were checked as the spec was read (RunSpec: its params are its
    method's Params, and the counts >= 1). Returns `spec`. Raises FileError naming `path` and the field."""
    path = Path(path)
    method_cls = registry.METHODS.get(spec.method)  # resolves: RunSpec read its params as this method's
    workload, _ = _lookup(path, "workload", registry.WORKLOADS, spec.workload)
    checked = check_run(method_cls, workload, dict(spec), Host.here())
    if checked.problem:
        raise FileError(f"{path}: {checked.problem.field}: {checked.problem.message}")
    if checked.warning:
        warnings.warn(f"{path}: {spec.run_id}: {checked.warning}", stacklevel=2)
    return spec
