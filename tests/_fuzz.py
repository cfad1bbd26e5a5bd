"""What the fuzz tests share: a TOML writer, the CLI called in-process, the one-line-error property, and a
filesystem snapshot that shows every path a call wrote."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, settings

from harness.cli import main

#: Every fuzz test: no deadline (the first example imports torch), derandomized (the examples are a function of the
#: test's code, so CI and every machine run the same ones, and no example database is read or written).
FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


# --- TOML out ---------------------------------------------------------------------------------------------------

def toml_value(value: Any) -> str:
    """A TOML literal for a bool, int, float (nan and inf too), str, list or dict (an inline table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value)  # TOML basic strings take JSON's escapes (\\uXXXX included)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def toml_text(doc: dict[str, Any]) -> str:
    """A TOML document: scalars and inline values first, then tables, then arrays of tables (`[[run]]`)."""
    lines, tables, arrays = [], [], []
    for key, value in doc.items():
        qkey = json.dumps(str(key))
        if isinstance(value, dict) and value:
            tables.append(f"[{qkey}]")
            tables += [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                arrays.append(f"[[{qkey}]]")
                arrays += [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in item.items()]
        else:
            lines.append(f"{qkey} = {toml_value(value)}")
    return "\n".join(lines + tables + arrays) + "\n"


# --- the CLI in-process -----------------------------------------------------------------------------------------

class Launched(Exception):
    """Raised by the stand-in launcher when a fuzz test must not get as far as a real run."""


def _fake_launch(spec, run_dir, *args, **kwargs):
    """The local launcher's stand-in: the run folder exists (prepare_run_dir made it); write its status and return."""
    from harness.launch.local import LaunchResult
    from harness.run.records import write_status

    write_status(Path(run_dir), "completed")
    return LaunchResult("completed", None, 0.0)


#: Where in its sandbox an example's command runs, and its --out: four folders deep, so that a name climbing out of
#: --out ('../../x') still lands in the sandbox, where the snapshot sees it.
WORK = Path("w", "w", "w", "w")
OUT = str(WORK / "out")


def cli(argv: list[str], root: Path) -> tuple[int, str, str]:
    """`dtbench ARGV` in this process, from the sandbox `root`'s WORK folder, with no warm-start server and a
    launcher that runs nothing: (exit code, stdout, stderr). argparse's SystemExit gives its code; any other
    exception propagates (the defect the fuzz tests look for). Warnings are appended to stderr as the command line
    prints them (one `dtbench: warning:` line each; in-process, main leaves them to the caller)."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(root / WORK)
    try:
        with mock.patch("harness.launch.warm.start"), mock.patch("harness.launch.suite.launch", _fake_launch), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(here)
    shown = "".join(f"dtbench: warning: {' '.join(str(w.message).split())}\n" for w in caught)
    return code, out.getvalue(), err.getvalue() + shown


def check_outcome(code: int, err: str, names: str | None = None) -> None:
    """The property of every call: exit 0, 1 or 2; every stderr line a `dtbench:` line (never a traceback); and on
    failure exactly one `dtbench: error:` line, which names `names` (the input file) when given."""
    assert code in (0, 1, 2), (code, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert all(line.startswith("dtbench: ") for line in lines), err
    errors = [line for line in lines if line.startswith("dtbench: error:")]
    if code == 2:
        assert len(errors) == 1, err
        if names is not None:
            assert names in errors[0], (names, errors[0])
    elif code == 0:
        assert not errors, err


# --- filesystem -------------------------------------------------------------------------------------------------

def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` (links not followed) -> (mtime_ns, size); a directory's size is 0."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            seen[os.path.relpath(path, root)] = (st.st_mtime_ns, 0 if os.path.isdir(path) else st.st_size)
    return seen


def written(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """The paths that are new, changed or gone between two snapshots (directories only when new or gone)."""
    changed = [p for p in after if p not in before or (after[p] != before[p] and after[p][1] != 0)]
    return sorted(changed + [p for p in before if p not in after])


def outside(paths: list[str], allowed: str) -> list[str]:
    """The paths (relative) that are neither `allowed` nor under it."""
    return [p for p in paths if p != allowed and not p.startswith(allowed + os.sep)]


@contextlib.contextmanager
def sandbox() -> Iterator[Path]:
    """A fresh folder for one example (with its WORK folder), removed after it."""
    with tempfile.TemporaryDirectory(prefix="dtbench-fuzz-") as root:
        (Path(root) / WORK).mkdir(parents=True)
        yield Path(root)
