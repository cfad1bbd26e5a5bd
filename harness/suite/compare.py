"""Which fields of two run specs differ: what `--resume` checks before it keeps a completed run, and what the page
marks on a run whose spec.json is not what the suite.toml beside it asks for (against_suite)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from harness.suite.spec import RunSpec

#: Fields that say where a spec came from, not what runs: a suite file moved or copied asks for the same runs.
PROVENANCE = frozenset({"suite_file"})

#: Fields a launch option sets on every run without the suite file (--nodes on SLURM): not a difference of the suite.
LAUNCH_FIELDS = frozenset({"nodes"})


def stored_spec(document: dict[str, Any] | str) -> RunSpec:
    """A spec.json (its text or its parsed object) read as today's RunSpec: the defaults of fields added since it
    was written filled in, so that only real differences remain. pydantic's ValidationError when it does not read."""
    if isinstance(document, str):
        return RunSpec.model_validate_json(document)
    return RunSpec.model_validate(document)


def differences(stored: RunSpec, wanted: RunSpec) -> list[str]:
    """The dotted paths of the fields whose values differ (params.lr, budget.max_steps, network.rate, ...), in the
    spec's field order; [] when the two run the same thing."""
    return _diff(_comparable(stored), _comparable(wanted), "")


def describe(stored: RunSpec, wanted: RunSpec, limit: int = 4) -> str:
    """The differing fields with both values, for one line: "params.lr 0.05 -> 0.1, budget.max_steps 100 -> 50"."""
    old, new = _comparable(stored), _comparable(wanted)
    paths = _diff(old, new, "")
    shown = [f"{path} {_at(old, path)} -> {_at(new, path)}" for path in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(shown) + more


def _comparable(spec: RunSpec) -> dict[str, Any]:
    return {key: value for key, value in spec.model_dump(mode="json").items() if key not in PROVENANCE}


def _diff(a: Any, b: Any, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        paths: list[str] = []
        for key in list(a) + [k for k in b if k not in a]:
            paths += _diff(a.get(key, _MISSING), b.get(key, _MISSING), f"{prefix}.{key}" if prefix else str(key))
        return paths
    return [] if _same(a, b) else [prefix or "(whole spec)"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


class _Missing:
    def __repr__(self) -> str:
        return "(unset)"


_MISSING = _Missing()


def _at(document: dict[str, Any], path: str) -> Any:
    value: Any = document
    for key in path.split("."):
        value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
    return value


def against_suite(suite_file: Path, stored: list[tuple[str, dict[str, Any]]]) -> tuple[list[tuple[str, str]],
                                                                                         str | None]:
    """([(folder, what differs)] for the stored specs (folder name, spec.json's object) that `suite_file` does not
    ask for under their run id, or a reason the check could not be made). The suite is expanded over the stored
    runs' seeds, so a seed it does not list (--seeds, `dtbench claims --until-decided`) is compared as the same run
    with that seed; a run launched with --network with the suite expanded under its network; launch fields
    (LAUNCH_FIELDS) are not compared. No such file: nothing to check."""
    from harness.suite.expand import expand_suite
    from harness.suite.files import FileError

    if not suite_file.is_file():
        return [], None
    parsed: list[tuple[str, RunSpec | str]] = []  # each folder's spec, or why its spec.json does not read
    for name, document in stored:
        try:
            parsed.append((name, stored_spec(document)))
        except ValueError as exc:
            parsed.append((name, f"its spec.json does not read as a spec ({str(exc).splitlines()[0]})"))
    # One expansion per network, over every stored run's seed: the suite's own and any that --seeds or
    # `dtbench claims --until-decided` added (each of those is the same run with another seed).
    seeds = sorted({spec.seed for _, spec in parsed if isinstance(spec, RunSpec)}) or None
    expansions: dict[str, dict[str, RunSpec]] = {}

    def expanded(network) -> dict[str, RunSpec]:
        key = network.model_dump_json() if network is not None else ""
        if key not in expansions:
            with warnings.catch_warnings():  # the machine's warnings (cores, threads) are the run's business
                warnings.simplefilter("ignore")
                expansions[key] = {s.run_id: s for s in expand_suite(suite_file, None, network, seeds=seeds)}
        return expansions[key]

    found = []
    try:
        plain = expanded(None)
        for name, spec in parsed:
            if isinstance(spec, str):
                found.append((name, spec))
                continue
            wanted = plain.get(spec.run_id)
            if wanted is None and spec.network is not None:  # launched with --network
                wanted = expanded(spec.network).get(spec.run_id)
            if wanted is None:
                found.append((name, "suite.toml has no such run"))
                continue
            wanted = wanted.model_copy(update={field: getattr(spec, field) for field in LAUNCH_FIELDS})
            if differences(spec, wanted):
                found.append((name, describe(wanted, spec)))
    except FileError as exc:
        return [], f"the runs could not be checked against {suite_file}: {exc}"
    return found, None
