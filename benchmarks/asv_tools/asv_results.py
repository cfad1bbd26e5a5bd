"""Reading asv result files (results format version 2) into tables, and finding the file of a commit.

asv writes one JSON file per machine, commit and environment: `<results>/<machine>/<hash[:8]>-<env>.json`, beside a
`<results>/benchmarks.json` that holds each benchmark's type, unit and parameter names. A parameterized benchmark
stores one value per combination of its parameters, in the order of itertools.product over `params`; a value is
null where that combination failed or was skipped.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

#: Columns of `load_results`' table, one row per benchmark and parameter combination.
COLUMNS = ("benchmark", "params", "value", "ci_low", "ci_high", "unit", "type", "started_at")
TYPES = {"time_": "time", "timeraw_": "time", "peakmem_": "peakmemory", "mem_": "memory", "track_": "track"}
UNITS = {"time": "seconds", "peakmemory": "bytes", "memory": "bytes"}


class ResultsError(Exception):
    """Results that are missing or unreadable; the message names the file or commit and what to run."""


def read_benchmarks(path: Path) -> dict[str, dict[str, Any]]:
    """benchmarks.json -> {benchmark name: its description}; {} when the file does not exist."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {name: value for name, value in data.items() if isinstance(value, dict)}


def benchmark_type(name: str) -> str:
    """The asv type of a benchmark from its function's name prefix ("track" when none matches)."""
    function = name.rsplit(".", 1)[-1]
    for prefix, kind in TYPES.items():
        if function.startswith(prefix):
            return kind
    return "track"


def _param_text(value: str) -> str:
    """asv stores parameter values as their repr: "'qsgd-4bit'" -> "qsgd-4bit", "1000000" stays."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def param_label(names: list[str], values: tuple[str, ...]) -> str:
    """("compressor", "numel"), ("'onebit'", "1000000") -> "compressor=onebit, numel=1000000"; "" for none."""
    return ", ".join(f"{name}={_param_text(value)}" for name, value in zip(names, values, strict=True))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def load_results(path: str | Path, benchmarks: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """One asv results file -> a table with COLUMNS, one row per benchmark and parameter combination.

    `value` is NaN where the benchmark failed; `ci_low`/`ci_high` are asv's 99% confidence interval of the value
    (NaN for track and memory benchmarks, which have none). Units and parameter names come from `benchmarks`
    (benchmarks.json), else from the file's own folder's parent, else from the name prefix.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        columns = data["result_columns"]
        results = data["results"]
    except (OSError, ValueError, KeyError) as err:
        raise ResultsError(f"{path}: not an asv results file ({err})") from None
    if benchmarks is None:
        benchmarks = read_benchmarks(path.parent.parent / "benchmarks.json")
    rows = []
    for name, row in sorted(results.items()):
        fields = dict(zip(columns, row, strict=False))
        described = benchmarks.get(name, {})
        kind = described.get("type") or benchmark_type(name)
        unit = described.get("unit") or UNITS.get(kind, "")
        params = fields.get("params") or []
        names = described.get("param_names") or [f"param{index + 1}" for index in range(len(params))]
        combinations = list(itertools.product(*params)) if params else [()]
        values = fields.get("result") or [None] * len(combinations)
        low = fields.get("stats_ci_99_a") or [None] * len(combinations)
        high = fields.get("stats_ci_99_b") or [None] * len(combinations)
        for index, combination in enumerate(combinations):
            rows.append({"benchmark": name, "params": param_label(names, combination),
                         "value": _number(values[index] if index < len(values) else None),
                         "ci_low": _number(low[index] if index < len(low) else None),
                         "ci_high": _number(high[index] if index < len(high) else None),
                         "unit": unit, "type": kind, "started_at": _number(fields.get("started_at"))})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def result_files(results_dir: str | Path, machine: str | None = None) -> list[Path]:
    """Every results file under results_dir (every machine's, or one machine's), newest first."""
    root = Path(results_dir)
    if machine:
        folders = [root / machine]
    else:
        folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    files = [f for folder in folders for f in folder.glob("*.json") if f.name != "machine.json"]
    return sorted(files, key=lambda f: f.stat().st_mtime, reverse=True)


def commit_hash(ref: str, repo: str | Path = ".") -> str:
    """The full hash of a git commit-ish (read-only `git rev-parse`)."""
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=repo,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ResultsError(f"{ref!r} is neither a results file nor a commit of the repository at {repo}")
    return done.stdout.strip()


def find_results(ref: str, results_dir: str | Path, machine: str | None = None, repo: str | Path = ".") -> Path:
    """The results file for `ref`: a path to a results file, or a commit-ish whose newest results are used."""
    if Path(ref).is_file():
        return Path(ref)
    full = commit_hash(ref, repo)
    files = [f for f in result_files(results_dir, machine) if f.name.startswith(full[:8] + "-")]
    if not files:
        where = f"{results_dir}/{machine or '*'}"
        raise ResultsError(f"no asv results for {ref} ({full[:8]}) in {where}: run `nox -s bench` with that commit "
                           f"checked out, or `nox -s bench -- --compare {ref}`, which measures it")
    return files[0]
