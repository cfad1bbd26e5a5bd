"""Reading run folders (spec, status, manifest, metrics) into Python, tolerant of runs killed mid-write."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where frames are made: ranks read records (trace_export) without it
    import pandas as pd

#: Columns every metrics frame has, even when the run wrote no records (the fields every record carries).
BASE_COLUMNS = ("kind", "rank", "wall_time_s", "train_time_s")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file into a list of records, one dict per line, in file order.

    A line that is not valid JSON (for example the truncated last line of a run killed mid-write) or that
    holds a JSON value other than an object is skipped with one warning naming the file and line number;
    every other line is kept. Blank lines are skipped silently. A missing file gives [].
    """
    path = Path(path)
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    with path.open("r", encoding="utf-8", errors="replace") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                warnings.warn(f"{path}:{lineno}: skipped a corrupt line (not valid JSON: {err.msg})",
                              stacklevel=2)
                continue
            if not isinstance(record, dict):
                kind = type(record).__name__
                warnings.warn(f"{path}:{lineno}: skipped a corrupt line (a JSON {kind}, not an object)",
                              stacklevel=2)
                continue
            records.append(record)
    return records


def read_json(path: str | Path) -> dict[str, Any] | None:
    """Read a JSON file holding one object. Missing: None; corrupt (or not an object): a warning and None."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        warnings.warn(f"{path}: ignored a corrupt JSON file ({err.msg} at line {err.lineno})", stacklevel=2)
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
    status and manifest are None when their file is missing or corrupt.
    """

    run_dir: Path
    spec: dict[str, Any]
    status: dict[str, Any] | None
    manifest: dict[str, Any] | None
    metrics: pd.DataFrame

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
    return RunResult(
        run_dir=run_dir,
        spec=spec,
        status=read_json(run_dir / "status.json"),
        manifest=read_json(run_dir / "manifest.json"),
        metrics=metrics_frame(read_jsonl(run_dir / "metrics.jsonl")),
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
