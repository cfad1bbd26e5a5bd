"""Shared pytest setup: headless plotting, one thread per process, the repo's root, and the test folders on
sys.path."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# The helpers (_dist, _compress, _fuzz, slurm_cluster) sit here; the tests, in one folder per area, import a few of
# each other's fixtures by module name (test_config's GOOD suite), so every area's folder is importable too.
HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), *(str(d) for d in sorted(HERE.iterdir()) if d.is_dir() and d.name.isidentifier()
                             and any(d.glob("test_*.py")))]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="module")
def one_thread():
    """For a module of tiny models: one thread is as fast, and does not thrash when other tests share the cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class Ran:
    """What one `dtbench` command did in this process: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def dtbench_here(capsys, monkeypatch):
    """`dtbench ARGS...` run in this process -> Ran. Its ranks fork from the test session's warm server, so a call
    costs no interpreter start and no torch import (a subprocess paid both, 2-4 s). The environment is the test's
    (monkeypatch.setenv reaches the ranks, which take the environment as it is when they start), with one thread
    per rank. For what only a real process shows (its exit on a signal, what outlives it, its warnings as printed
    lines), run `python -m harness.cli` instead."""
    from harness.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def run(*args: str | os.PathLike, cwd: str | os.PathLike | None = None) -> Ran:
        capsys.readouterr()
        with contextlib.chdir(cwd or os.getcwd()):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse's refusals: exit 2 with its usage line
                code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


def pytest_collection_modifyitems(config, items) -> None:
    """slurm tests run only when asked for (-m slurm, as nox -s slurm does): they start a whole cluster."""
    if "slurm" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="needs the local SLURM cluster: run nox -s slurm (or pytest -m slurm)")
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(skip)
