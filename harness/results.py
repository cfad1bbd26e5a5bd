"""Reading run folders (spec, status, manifest, metrics) into Python, tolerant of runs killed mid-write."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where frames are made: ranks read records (trace_export) without it
    import pandas as pd

#: Columns every metrics frame has, even when the run wrote no records (the fields every record carries).
BASE_COLUMNS = ("kind", "rank", "wall_time_s", "train_time_s")
#: Fields of `train` and `eval` records that hold a finite number where present; loss and test_loss may be NaN or
#: inf (a diverged run), which the writer spells as strings.
RECORD_NUMBERS = ("step", "epoch", "samples", "loss", "bytes_sent", "bytes_recv", "test_accuracy", "test_loss")
#: How the metrics writer spells the floats JSON has no literal for (harness/run/records.py).
NON_FINITE = ("nan", "inf", "-inf")
#: spec.json and status.json fields the readers use, with the JSON types each must have. A field of another type is
#: dropped with a warning naming the file and the field, as if the file lacked it.
SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "suite": (str,), "run_id": (str,), "label": (str,), "method": (str,), "family": (str,), "workload": (str,),
    "world_size": (int,), "seed": (int,), "nodes": (int,), "budget": (dict,), "params": (dict,),
    "workload_options": (dict,), "suite_file": (str,), "network": (dict,), "threads_per_rank": (int, list),
}  # fmt: skip
STATUS_FIELDS: dict[str, tuple[type, ...]] = {"state": (str,), "error": (dict, str), "final": (dict,)}


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """A number that is finite as a float too (JSON's integers have no bound: 10**400 is not one)."""
    if not _is_number(value):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def record_problem(record: dict[str, Any]) -> str | None:
    """Why a metrics record cannot be read as the results contract says (docs/results.md), or None when it can:
    `kind` a string, `rank` a count, the two clocks finite numbers, and the numbers of `train` and `eval` records
    numbers (test_accuracy a fraction). Other kinds' own fields are the readers' of those kinds to judge."""
    if not isinstance(record.get("kind"), str):
        return "its kind is not a string"
    rank = record.get("rank")
    if rank is not None and not (_finite(rank) and rank == int(rank) and rank >= 0):
        return f"rank {rank!r} is not a rank"
    for field in ("wall_time_s", "train_time_s"):
        value = record.get(field)
        if value is not None and not _finite(value):
            return f"{field} {value!r} is not a finite number"
    if record["kind"] in ("train", "eval"):
        for field in RECORD_NUMBERS:
            value = record.get(field)
            if value is None or (field in ("loss", "test_loss") and (_is_number(value) or value in NON_FINITE)):
                continue  # a diverged run's loss is NaN or inf
            if not _finite(value):
                return f"{field} {value!r} is not a finite number"
        accuracy = record.get("test_accuracy")
        if accuracy is not None and not 0 <= accuracy <= 1:
            return f"test_accuracy {accuracy!r} is not in [0, 1]"
    return None


def drop_mistyped(doc: dict[str, Any] | None, fields: dict[str, tuple[type, ...]], path: Path) -> dict[str, Any] | None:
    """`doc` without the fields whose value is not of their type (a warning each, naming the file and the field);
    a budget's limits that are not numbers, and a bool where a count belongs, are dropped too."""
    if doc is None:
        return None
    kept = dict(doc)
    for field, types in fields.items():
        value = kept.get(field)
        if value is None:
            continue
        if not isinstance(value, types) or (int in types and isinstance(value, bool)):
            expected = " or ".join(_JSON_TYPES[t] for t in types)
            warnings.warn(f"{path}: {field}: ignored (a JSON {_JSON_TYPES.get(type(value), type(value).__name__)}, "
                          f"not {expected})", stacklevel=3)
            del kept[field]
    budget = kept.get("budget")
    if isinstance(budget, dict):
        bad = [k for k, v in budget.items() if v is not None and not _finite(v)]
        target = budget.get("target_accuracy")
        if "target_accuracy" not in bad and _is_number(target) and not 0 < target <= 1:
            bad.append("target_accuracy")
        for key in bad:
            warnings.warn(f"{path}: budget.{key}: ignored {budget[key]!r}, not a finite number in range",
                          stacklevel=3)
        kept["budget"] = {k: v for k, v in budget.items() if k not in bad}
    return kept


def read_jsonl(path: str | Path, check: Callable[[dict[str, Any]], str | None] | None = None) -> list[dict[str, Any]]:
    """Read a JSON-lines file into a list of records, one dict per line, in file order.

    A line that is not valid JSON (for example the truncated last line of a run killed mid-write), that holds a
    JSON value other than an object, or (with `check`) whose object `check` finds a problem with, is skipped with
    one warning naming the file and line number; every other line is kept. Blank lines are skipped silently. A
    missing file gives [].
    """
    return read_jsonl_counted(path, check)[0]


def read_jsonl_counted(path: str | Path, check: Callable[[dict[str, Any]], str | None] | None = None,
                       ) -> tuple[list[dict[str, Any]], int]:
    """read_jsonl's records, and how many corrupt lines it skipped."""
    path = Path(path)
    if not path.is_file():
        return [], 0
    records: list[dict[str, Any]] = []
    dropped = 0
    with path.open("r", encoding="utf-8", errors="replace") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as err:  # JSONDecodeError, and a number too long to convert
                problem = f"not valid JSON: {getattr(err, 'msg', None) or 'nested too deep or a number too long'}"
            else:
                if not isinstance(record, dict):
                    problem = f"a JSON {type(record).__name__}, not an object"
                else:
                    problem = check(record) if check is not None else None
            if problem:
                warnings.warn(f"{path}:{lineno}: skipped a corrupt line ({problem})", stacklevel=3)
                dropped += 1
                continue
            records.append(record)
    return records, dropped


def read_json(path: str | Path) -> dict[str, Any] | None:
    """Read a JSON file holding one object. Missing: None; corrupt (or not an object): a warning and None."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as err:
        warnings.warn(f"{path}: ignored a JSON file that cannot be read ({err.strerror or err})", stacklevel=2)
        return None
    except json.JSONDecodeError as err:
        warnings.warn(f"{path}: ignored a corrupt JSON file ({err.msg} at line {err.lineno})", stacklevel=2)
        return None
    except RecursionError:
        warnings.warn(f"{path}: ignored a corrupt JSON file (nested too deep)", stacklevel=2)
        return None
    if not isinstance(value, dict):
        kind = type(value).__name__
        warnings.warn(f"{path}: ignored a JSON file that holds a {kind}, not an object", stacklevel=2)
        return None
    return value


@dataclass
class RunResult:
    """Everything one run folder holds.

    metrics: one row per metrics.jsonl record (all kinds, all ranks, file order); its columns are the union of
    the records' keys and always include BASE_COLUMNS. Keys a record lacks are NaN/None in its row.
    status and manifest are None when their file is missing or corrupt; spec and status lack the fields whose value
    was of the wrong type (SPEC_FIELDS, STATUS_FIELDS). dropped_lines: the corrupt lines of metrics.jsonl that were
    skipped (record_problem), each with a warning.
    """

    run_dir: Path
    spec: dict[str, Any]
    status: dict[str, Any] | None
    manifest: dict[str, Any] | None
    metrics: pd.DataFrame
    dropped_lines: int = 0

    @property
    def label(self) -> str:
        """The run's group in reports: spec["label"], else spec["method"], else the folder name."""
        return str(self.spec.get("label") or self.spec.get("method") or self.run_dir.name)

    @property
    def state(self) -> str:
        """status.json's state, or "unknown" when there is no readable status."""
        return str((self.status or {}).get("state") or "unknown")


def metrics_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Records -> DataFrame (records x union of keys); BASE_COLUMNS are present even without records."""
    import pandas as pd

    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    for column in BASE_COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.Series(dtype=object if column == "kind" else float)
    return frame


def load_run(run_dir: str | Path) -> RunResult:
    """Load one run folder. Raises ValueError when its spec.json is missing or unreadable."""
    run_dir = Path(run_dir)
    spec = read_json(run_dir / "spec.json")
    if spec is None:
        raise ValueError(f"{run_dir}: not a run folder (spec.json is missing or corrupt)")
    records, dropped = read_jsonl_counted(run_dir / "metrics.jsonl", record_problem)
    return RunResult(
        run_dir=run_dir,
        spec=drop_mistyped(spec, SPEC_FIELDS, run_dir / "spec.json"),
        status=drop_mistyped(read_json(run_dir / "status.json"), STATUS_FIELDS, run_dir / "status.json"),
        manifest=read_json(run_dir / "manifest.json"),
        metrics=metrics_frame(records),
        dropped_lines=dropped,
    )


def load_suite(suite_dir: str | Path) -> list[RunResult]:
    """Load every run of a suite folder: each subfolder holding a spec.json, sorted by name, skipping report/.

    A run whose spec.json is corrupt is skipped with a warning. A missing folder gives [].
    """
    suite_dir = Path(suite_dir)
    if not suite_dir.is_dir():
        return []
    runs = []
    for run_dir in sorted(p for p in suite_dir.iterdir() if p.is_dir() and p.name != "report"):
        if not (run_dir / "spec.json").is_file():
            continue
        try:
            runs.append(load_run(run_dir))
        except ValueError as err:
            warnings.warn(f"skipped a run: {err}", stacklevel=2)
    return runs


def target_of(spec: dict[str, Any]) -> tuple[str, float] | None:
    """A run's target: ("accuracy", a) for the budget's target_accuracy, ("loss", l) for its target_loss, or None."""
    budget = spec.get("budget") or {}
    for kind in ("accuracy", "loss"):
        value = budget.get(f"target_{kind}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return kind, float(value)
    return None


def reached_target(evals: pd.DataFrame, spec: dict[str, Any]) -> pd.Series:
    """Which eval records meet the run's target: test_accuracy >= target_accuracy, or test_loss <= target_loss
    (all False without a target)."""
    import pandas as pd

    target = target_of(spec)
    if target is None:
        return pd.Series(False, index=evals.index)
    kind, value = target
    column = "test_accuracy" if kind == "accuracy" else "test_loss"
    values = pd.to_numeric(evals[column], errors="coerce").astype(float) if column in evals else \
        pd.Series(float("nan"), index=evals.index)
    return values >= value if kind == "accuracy" else values <= value
