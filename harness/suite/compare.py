"""Which fields of two run specs differ: what `--resume` checks before it keeps a completed run, and what the page
marks on a run whose spec.json is not what the suite.toml beside it asks for."""

from __future__ import annotations

from typing import Any

from harness.suite.spec import RunSpec

#: Fields that say where a spec came from, not what runs: a suite file moved or copied asks for the same runs.
PROVENANCE = frozenset({"suite_file"})


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
