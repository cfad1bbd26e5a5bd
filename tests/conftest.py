"""Shared pytest setup: headless plotting, one thread per process, the repo's root, and the test folders on
sys.path."""

from __future__ import annotations

import os
import sys
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


def pytest_collection_modifyitems(config, items) -> None:
    """slurm tests run only when asked for (-m slurm, as nox -s slurm does): they start a whole cluster."""
    if "slurm" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="needs the local SLURM cluster: run nox -s slurm (or pytest -m slurm)")
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(skip)
