"""Every asv benchmark, and every script of benchmarks/measure and benchmarks/checks, runs once here at its smallest
size: a benchmark that names a moved or renamed thing fails the tests, not a later `nox -s bench`."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import itertools
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
ASV_DIR = BENCHMARKS / "asv"
SUITE_PACKAGE = "dtbench_asv_suite"  # not `asv`, asv's own name for the folder: that is the asv tool's package
#: asv's benchmark kinds, by the function name's prefix (asv_runner.benchmarks).
PREFIXES = ("time_", "timeraw_", "track_", "mem_", "peakmem_")

#: Module constants that set how long a benchmark measures (its rounds, steps and block seconds, the sizes of a
#: side-by-side comparison), not what it runs: at their least here, so that each benchmark runs all of its code once,
#: quickly. A constant renamed in the benchmark fails the test (monkeypatch.setattr raises), so this cannot go stale.
QUICK: dict[str, dict[str, Any]] = {
    "compressors": {"RATIO_ROUNDS": 1, "RATIO_MIN_SECONDS": 0.0},
    "pipeline": {"PEER_ROUNDS": 1, "PEER_STEPS": 1,
                 "PEER_SIZES": {"width": 32, "layers": 8, "batch": 16, "microbatches": 8},
                 "STAGE_ROUNDS": 1, "STAGE_MIN_SECONDS": 0.0, "BACKWARD_ROUNDS": 2, "BACKWARDS_PER_ROUND": 1},
    "report": {"SEEDS": [0], "STEPS": 44},
    "runner": {"DDP_ROUNDS": 1, "DDP_STEPS": 2, "COST_ROUNDS": 1, "COST_STEPS": 2, "COST_CPU_STEPS": 2,
               "SUITE_SEEDS": 1},
}


def suite_modules() -> list[str]:
    """The modules of benchmarks/asv, as asv walks them: every .py file but the package's own __init__."""
    return sorted(path.stem for path in ASV_DIR.glob("*.py") if path.stem != "__init__")


@contextlib.contextmanager
def working_directory(folder: Path) -> Iterator[None]:
    """The process's working directory is `folder` inside the block (contextlib.chdir needs Python 3.11)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def import_suite_module(name: str) -> Any:
    """benchmarks/asv/<name>.py imported as asv imports it: a submodule of the benchmark folder's package (its
    relative imports resolve), whose __init__ has put the code root, the tests and the folder itself on sys.path."""
    if SUITE_PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(SUITE_PACKAGE, ASV_DIR / "__init__.py",
                                                      submodule_search_locations=[str(ASV_DIR)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[SUITE_PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{SUITE_PACKAGE}.{name}")


def is_size(value: Any) -> bool:
    """A number, or a tuple of numbers (a shape): a parameter value that is a size, not a choice."""
    if isinstance(value, tuple):
        return bool(value) and all(is_size(v) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def smallest_params(params: Any) -> list[tuple]:
    """The parameter combinations to run: the smallest value of every size parameter, every value of every other
    (a choice such as a compressor's or schedule's name: each names different code). [()] without parameters."""
    if params is None or (isinstance(params, list | tuple) and len(params) == 0):
        return [()]
    # asv's rule: when the first item is a list or tuple, params holds one list of values per parameter; otherwise
    # it is the values of the only parameter
    lists = params if isinstance(params[0], list | tuple) else [params]
    chosen = [[min(values)] if all(is_size(v) for v in values) else list(values) for values in lists]
    return list(itertools.product(*chosen))


def benchmark_groups(module: Any) -> list[tuple[str, Any, list[str]]]:
    """(name, owner, benchmark function names) for each class of `module` with benchmarks and for the module's own
    benchmark functions (owner: the module); classes imported from elsewhere are left to their own module."""
    groups = []
    functions = sorted(n for n, v in vars(module).items() if n.startswith(PREFIXES) and inspect.isfunction(v))
    if functions:
        groups.append((module.__name__.rsplit(".", 1)[-1], module, functions))
    for name, cls in sorted(vars(module).items()):
        if not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        names = sorted(n for n in dir(cls) if n.startswith(PREFIXES) and callable(getattr(cls, n)))
        if names:
            groups.append((name, cls, names))
    return groups


def run_group(owner: Any, names: list[str], folder: Path) -> list[str]:
    """Run one class's (or module's) benchmarks as asv does, once each at the smallest parameters: setup_cache once
    (in `folder`, asv's working directory for it), then per parameter combination setup, every benchmark function,
    teardown. -> the failures, each with its benchmark, parameters and traceback."""
    failures: list[str] = []
    cache: tuple = ()
    setup_cache = getattr(owner, "setup_cache", None)
    if setup_cache is not None:
        try:
            with working_directory(folder):
                cache = (setup_cache(owner()) if inspect.isclass(owner) else setup_cache(),)
        except Exception:  # noqa: BLE001
            return [f"{owner.__name__}.setup_cache:\n{traceback.format_exc()}"]
    for combination in smallest_params(getattr(owner, "params", None)):
        instance = owner() if inspect.isclass(owner) else owner
        args = (*cache, *combination)
        setup, teardown = getattr(instance, "setup", None), getattr(instance, "teardown", None)
        try:
            if setup is not None:
                setup(*args)
        except NotImplementedError:  # asv's way for a setup to skip a combination
            continue
        except Exception:  # noqa: BLE001
            failures.append(f"{owner.__name__}.setup{combination}:\n{traceback.format_exc()}")
            continue
        try:
            for name in names:
                try:
                    getattr(instance, name)(*args)
                except Exception:  # noqa: BLE001
                    failures.append(f"{owner.__name__}.{name}{combination}:\n{traceback.format_exc()}")
        finally:
            if teardown is not None:
                teardown(*args)
    return failures


@pytest.fixture(scope="module")
def asv_suite() -> Iterator[None]:
    """For this module's tests, the benchmark folder imported as asv imports it; afterwards sys.path and sys.modules
    as they were (its __init__ puts the code root, the tests and the folder itself first on sys.path)."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name == SUITE_PACKAGE or name.startswith(SUITE_PACKAGE + ".") or name in suite_modules():
            del sys.modules[name]


#: The benchmark modules that start processes (ranks, `dtbench run`): the `slow` marker's kind (pyproject.toml).
MULTI_PROCESS = {"pipeline", "runner"}


@pytest.mark.parametrize("module_name", [pytest.param(name, marks=[pytest.mark.slow] if name in MULTI_PROCESS else [])
                                         for name in suite_modules()])
def test_every_asv_benchmark_runs_once(module_name, tmp_path, asv_suite, monkeypatch):
    module = import_suite_module(module_name)
    for constant, value in QUICK.get(module_name, {}).items():
        monkeypatch.setattr(module, constant, value)
    failures = []
    for group, owner, names in benchmark_groups(module):
        folder = tmp_path / group
        folder.mkdir()
        failures += run_group(owner, names, folder)
    assert not failures, f"benchmarks/asv/{module_name}.py:\n" + "\n".join(failures)


def test_the_smallest_parameters_keep_every_choice_and_the_least_size():
    assert smallest_params(None) == [()] and smallest_params([]) == [()]
    assert smallest_params(["sgd", "ddp"]) == [("sgd",), ("ddp",)]
    assert smallest_params(([1_000_000, 25_000], ["copy", "qsgd"])) == [(25_000, "copy"), (25_000, "qsgd")]
    assert smallest_params((["gpipe"], [(16, 64), (4, 8)])) == [("gpipe", (4, 8))]


def test_a_benchmark_naming_a_moved_thing_fails_the_run(tmp_path):
    class Stale:  # as benchmarks/asv/pipeline.py stood when pipedream's generator had moved to its own package
        params = (["gpipe", "moved_generator"], [(4, 8), (16, 64)])

        def time_generate(self, name: str, size: tuple[int, int]) -> None:
            from methods.pipeline.flushed import schedules

            getattr(schedules, name)(*size)

    failures = run_group(Stale, ["time_generate"], tmp_path)
    assert len(failures) == 1 and "time_generate('moved_generator', (4, 8))" in failures[0]
    assert "has no attribute 'moved_generator'" in failures[0]


# -- the scripts of benchmarks/measure and benchmarks/checks ---------------------------------------------------------

#: One tiny run of each script with a size option: its fewest rounds, steps and epochs, its smallest model.
#: "{corpus}" is a folder of two small text files (no download).
TINY_RUNS: dict[str, list[str]] = {
    "measure/apapo_study.py": ["handling", "--epochs", "1", "--seeds", "0"],
    "measure/pipeline_breakdown.py": ["--width", "32", "--steps", "2"],
    "measure/gpt_pipelining.py": ["--steps", "1", "--blocks", "1", "--n-layer", "2", "--n-head", "2", "--d-model",
                                  "16", "--context", "8", "--batch", "4", "--microbatches", "2", "--corpus",
                                  "{corpus}"],
    "measure/gpt_step.py": ["--steps", "1", "--blocks", "1", "--corpus", "{corpus}"],
    "measure/pipeline_step.py": ["--rounds", "1", "--steps", "1", "--width", "32", "--layers", "4", "--batch", "16",
                                 "--microbatches", "2"],
    "measure/zero_bubble_step.py": ["--rounds", "1", "--steps", "1", "--width", "32", "--layers", "4", "--batch",
                                    "16", "--microbatches", "2"],
    "measure/qfb_lanes.py": ["--rounds", "1", "--steps", "1", "--width", "32", "--depth", "2", "--batch", "16",
                             "--microbatches", "2"],
    "measure/ddp_overhead.py": ["--rounds", "1", "--steps", "2"],
    "measure/startup.py": ["--rounds", "1", "--cases", "sgd"],
    "measure/compressors.py": ["--numel", "4096", "--repeat", "1"],
    "checks/load.py": ["--workers", "1", "--", sys.executable, "-c", "print('ran under load')"],
    "checks/claims_level.py": ["--replicates", "100"],
    "checks/memory_table.py": ["--run", "--only", "sgd-digits-mlp-*"],
}
#: Scripts run here with --help only, and why.
HELP_ONLY: dict[str, str] = {
    "checks/faults.py": "no size option: every case is a 2-epoch run of digits-mlp and its report, about 20 minutes "
                        "in all (docs/reliability.md)",
    "checks/gpu_check.py": "its size option (--epochs) shortens the whole smoke suite; without CUDA it prints one "
                           "line, and tests/house/test_gpu_check.py runs its checks on a 1-epoch ddp suite",
}
SCRIPT_TIMEOUT_S = 300
TEXT = ("Shall I compare thee to a summer's day? Thou art more lovely and more temperate: rough winds do shake the "
        "darling buds of May, and summer's lease hath all too short a date. ")


def scripts() -> list[str]:
    """The scripts of benchmarks/measure and benchmarks/checks (files with a `__main__` block), relative paths."""
    found = []
    for folder in ("measure", "checks"):
        for path in sorted((BENCHMARKS / folder).glob("*.py")):
            if 'if __name__ == "__main__":' in path.read_text():
                found.append(f"{folder}/{path.name}")
    return found


def run_script(script: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=SCRIPT_TIMEOUT_S)


def _explain(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}"


def test_every_script_has_a_tiny_run_or_a_reason():
    assert sorted([*TINY_RUNS, *HELP_ONLY]) == sorted(scripts())


@pytest.mark.parametrize("script", scripts())
def test_every_script_answers_help(script):
    done = run_script(script, ["--help"], {**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0 and done.stdout.startswith("usage:"), _explain(done)


@pytest.fixture(scope="module")
def script_env(tmp_path_factory) -> dict[str, str]:
    """The tiny runs' environment, with "{corpus}": a folder of two small text files, and a cache of their own."""
    corpus = tmp_path_factory.mktemp("corpus")
    (corpus / "a.txt").write_text(TEXT * 20)
    (corpus / "b.txt").write_text(TEXT.upper() * 10)
    return {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "CORPUS": str(corpus),
            "DTBENCH_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "dtbench-cache")}


# Each is a fresh interpreter that imports torch, and most start ranks: 3 to 15 s apiece (run two at once, they
# took as long in all: two ranks each on the 2 cores).
@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY_RUNS))
def test_every_script_runs_a_tiny_run(script, script_env):
    done = run_script(script, [arg.format(corpus=script_env["CORPUS"]) for arg in TINY_RUNS[script]], script_env)
    assert done.returncode == 0, _explain(done)
