"""Suite files expanded: every run of a suite file validated and resolved into run specs, one per seed."""

from __future__ import annotations

import difflib
import fnmatch
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import registry
from harness.bytesize import parse_bytes
from harness.net.spec import NetworkSpec
from harness.run.lr_schedule import schedule_problem
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


def expand_suite(path: str | Path, only: str | None = None, network: NetworkSpec | None = None) -> list[RunSpec]:
    """Validate a suite file and expand it into one RunSpec per run and seed, in file order: the top-level [[run]]s,
    then each [[group]]'s runs (harness/suite/groups.py), each once per seed.

    Checks every method name, workload name, method and workload parameter, world size, and the stages or chunks
    a method asks of the workload's blocks (without data: the model on the meta device). Any problem raises
    FileError naming the file and the field; nothing is written by this function. `network` (from --network)
    replaces the suite's and every run's network.
    """
    path = Path(path)
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
        try:  # strict here, not in each workload's Options: every workload's options, a plugin's too
            resolved_options = workload.Options.model_validate(options, strict=True).model_dump()
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            prefix = placed.option_field(str(loc[0])) if loc else f"{where}.workload_options"
            raise first_error(path, exc, prefix=prefix, model=workload.Options) from None

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
        try:
            params = method_cls.Params.model_validate(merged)
        except ValidationError as exc:
            key = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
            error = first_error(path, exc, prefix=placed.param_field(key, suite.defaults), model=method_cls.Params)
            raise FileError(f"{error} (run {where}, method {entry.method!r})") from None
        problem = method_cls.check_world_size(entry.world_size, params)
        if problem:
            raise FileError(f"{path}: {where}.world_size: {problem} (method {entry.method!r})")
        _check_model(path, placed, suite, method_cls, params, (workload_name, workload, resolved_options))
        nodes = entry.nodes or suite.nodes
        if entry.world_size % nodes:
            raise FileError(f"{path}: {where + '.nodes' if entry.nodes else 'nodes'}: world_size "
                            f"{entry.world_size} of {where} is not divisible by {nodes} nodes")

        budget = (entry.budget.over(suite.budget) if entry.budget else suite.budget).over(workload.budget)
        if budget.max_epochs is None and budget.max_steps is None and budget.max_train_seconds is None:
            raise FileError(f"{path}: budget: give at least one of max_epochs, max_steps, max_train_seconds")
        problem = schedule_problem(params, budget.max_steps, budget.max_epochs)
        if problem:
            key, why = problem
            origin = placed.param_field(key, suite.defaults, fallback="defaults")
            raise FileError(f"{path}: {origin}.{key}: {why} (run {where}, method {entry.method!r})")
        threads = entry.threads_per_rank if entry.threads_per_rank is not None else suite.threads_per_rank
        if threads is None:  # not `or`: a run's 0 or [] is an error below, not "unset"
            threads = default_threads(entry.world_size)
        cpus = entry.cpus_per_rank
        problem = rank_layout_problem(threads, cpus, entry.world_size)
        if problem:
            raise FileError(f"{path}: {where}.{problem}")
        run_network = network or entry.network or suite.network
        memory_field = f"{where}.memory_per_rank" if entry.memory_per_rank is not None else "memory_per_rank"
        memory_value = entry.memory_per_rank if entry.memory_per_rank is not None else suite.memory_per_rank
        try:
            memory_per_rank = None if memory_value is None else parse_bytes(memory_value)
        except ValueError as exc:
            raise FileError(f"{path}: {memory_field}: {exc}") from None
        spec_fields = dict(
            suite=suite.name, method=entry.method, family=method_cls.family, workload=workload_name,
            workload_options=resolved_options, world_size=entry.world_size, params=params.model_dump(),
            budget=budget, threads_per_rank=threads, cpus_per_rank=cpus, deterministic=suite.deterministic,
            log_every_steps=suite.log_every_steps, checkpoint_every_steps=suite.checkpoint_every_steps,
            hang_timeout_s=entry.hang_timeout_s or suite.hang_timeout_s, allocator=entry.allocator or suite.allocator,
            nodes=nodes, data_root=suite.data_root, suite_file=str(path.resolve()), network=run_network,
            method_origin=method_entry.origin, workload_origin=workload_entry.origin, memory_per_rank=memory_per_rank,
            baseline=placed.group_entry.baseline if placed.group_entry is not None else suite.baseline)
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
        for seed in suite.seeds:
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


def _check_model(path: Path, placed: PlacedRun, suite: SuiteFile, method_cls, params,
                 workload_of: tuple[str, Any, dict[str, Any]]) -> None:
    """What the method asks of the workload's model (stages, chunks against its blocks), on the model built on the
    meta device, for workloads that give one (Workload.make_model). Raises FileError naming the field."""
    name, workload, options = workload_of
    entry = placed.entry
    if getattr(workload, "make_model", None) is None:
        return

    def model():
        try:
            return workload.meta_model(options)
        except ValueError as exc:
            raise FileError(f"{path}: {placed.options_field}: {exc}") from None

    problem = method_cls.check_model(entry.world_size, params, model)
    if problem:
        key, reason = problem
        if key == "world_size":
            field = f"{placed.where}.world_size"
        else:
            field = f"{placed.param_field(key, suite.defaults)}.{key}"
        raise FileError(f"{path}: {field}: {reason} (workload {name!r})")


def rank_layout_problem(threads: int | list[int], cpus: list[list[int]] | None, world_size: int) -> str | None:
    """'<field>: <why>' when the per-rank threads or CPU lists do not fit `world_size` ranks, else None: a count >= 1
    or one per rank; one non-empty list of CPU ids per rank."""
    counts = threads if isinstance(threads, list) else [threads]
    if not counts or any(c < 1 for c in counts) or (isinstance(threads, list) and len(threads) != world_size):
        return f"threads_per_rank: give a count >= 1, or a list of one per rank ({world_size}), got {threads}"
    if cpus is not None and (len(cpus) != world_size or any(not c or min(c) < 0 for c in cpus)):
        return f"cpus_per_rank: give one non-empty list of CPU ids per rank ({world_size}), got {cpus}"
    return None


def label_inputs(method_name: str, fields: dict[str, Any]) -> LabelInputs:
    """What may set a run (its RunSpec fields but label, id and seed) apart from its method's other runs: params,
    workload options (named `options.<key>` where a param has the key), budget, layout and allocator."""
    settings = dict(fields["params"])
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
    """Check a resolved run spec read back from a spec.json (`dtbench rerun`) as expand_suite checks a suite's runs:
    the method and workload resolve, their params and options validate, and the world size, nodes, threads and
    budget fit. Returns the spec with its params as its method's Params write them now (an earlier spec.json's
    form read as today's: PB's reference_lr). Raises FileError naming `path` and the field."""
    path = Path(path)
    method_cls, _ = _lookup(path, "method", registry.METHODS, spec.method)
    workload, _ = _lookup(path, "workload", registry.WORKLOADS, spec.workload)
    try:
        workload.Options.model_validate(spec.workload_options, strict=True)
    except ValidationError as exc:
        raise first_error(path, exc, prefix="workload_options") from None
    try:
        params = method_cls.Params.from_spec(spec.params)
    except ValidationError as exc:
        raise first_error(path, exc, prefix="params") from None
    except ValueError as exc:  # a derived value that its keys do not give
        raise FileError(f"{path}: params.{exc}") from None
    problem = method_cls.check_world_size(spec.world_size, params)
    if problem:
        raise FileError(f"{path}: world_size: {problem}")
    if spec.nodes < 1 or spec.world_size % spec.nodes:
        raise FileError(f"{path}: nodes: {spec.nodes} does not divide world_size {spec.world_size}")
    problem = rank_layout_problem(spec.threads_per_rank, spec.cpus_per_rank, spec.world_size)
    if problem:
        raise FileError(f"{path}: {problem}")
    for field in ("log_every_steps", "checkpoint_every_steps"):
        value = getattr(spec, field)
        if value is not None and value < 1:
            raise FileError(f"{path}: {field}: give a count >= 1, got {value}")
    budget = spec.budget
    if budget.max_epochs is None and budget.max_steps is None and budget.max_train_seconds is None:
        raise FileError(f"{path}: budget: give at least one of max_epochs, max_steps, max_train_seconds")
    problem = schedule_problem(params, budget.max_steps, budget.max_epochs)
    if problem:
        raise FileError(f"{path}: params.{problem[0]}: {problem[1]}")
    return spec.model_copy(update={"params": params.model_dump()})
