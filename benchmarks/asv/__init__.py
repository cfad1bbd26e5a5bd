"""dtbench's asv benchmarks (docs/benchmarks.md); this file puts the code under test on sys.path.

asv strips PYTHONPATH and loads this folder as a package of its own, so the code root (harness, methods) is added
here, with the tests folder (the `_dist` process helpers) and this folder itself, whose `dtbench_bench_ranks` module
spawned ranks import by that top-level name. DTBENCH_BENCH_ROOT, when set, names another source tree whose code is
measured instead: `nox -s bench -- --compare REV` points it at an export of REV, so the current benchmarks measure
that commit's code, as `asv continuous` would.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
CODE_ROOT = Path(os.environ.get("DTBENCH_BENCH_ROOT") or BENCH_DIR.parents[1]).resolve()

for _path in (str(BENCH_DIR), str(BENCH_DIR.parents[1] / "tests"), str(CODE_ROOT)):
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)  # the last inserted, the code root, comes first
