"""nox sessions: smoke (the main job), tests, dev, slurm, gpu, lint and bench. smoke, tests, dev, slurm and gpu share
one virtualenv, .venv, so torch installs once; lint and bench keep their own."""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import nox

# nox probes for uv whenever it sets a session up and logs "uv binary not found." where there is none; every session
# here makes its virtualenv with virtualenv or uses .venv, so the line says nothing a reader needs.
logging.getLogger("nox").addFilter(lambda record: record.getMessage() != "uv binary not found.")

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent
INSTALL_INPUTS = ("pyproject.toml", "constraints.txt")


def _digest(extras: str) -> str:
    """What an install depends on: the extras and the files that pin the dependencies."""
    digest = hashlib.sha256(extras.encode())
    for name in INSTALL_INPUTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def install(session: nox.Session, extras: str) -> None:
    """Install dtbench (editable) with `extras` into the session's own virtualenv (the bench session's), pinned by
    constraints.txt; skipped when nothing changed since."""
    marker = Path(session.virtualenv.location) / ".dtbench-install"
    if marker.exists() and marker.read_text() == _digest(extras):
        session.log("dependencies unchanged since the last install; skipping pip")
        return
    session.log(f"installing dtbench[{extras}] and its pinned dependencies (torch among them) into "
                f"{session.virtualenv.location}: a few minutes the first time, skipped afterwards")
    # pip's own progress lines show (nox hides a command's output by default), so a long install is not silent.
    session.install("-c", "constraints.txt", "-e", f".[{extras}]" if extras else ".", "--progress-bar", "off",
                    silent=False)
    marker.write_text(_digest(extras))


#: The project's one virtualenv: smoke, tests, slurm, gpu and dev all run in it, so torch installs once.
VENV = ROOT / ".venv"
VENV_BIN = VENV / ("Scripts" if sys.platform == "win32" else "bin")
SHARED_EXTRAS = "test"


def shared_venv(session: nox.Session) -> Path:
    """.venv, made with virtualenv (a dependency of nox, so no python3-venv package is needed) for the Python that
    runs nox when it is missing, with dtbench installed (editable) and its test extras, pinned by constraints.txt;
    pip is skipped when nothing changed since. -> its bin folder. Run one of these sessions at a time."""
    python = VENV_BIN / "python"
    if not python.exists():
        session.log(f"making the virtualenv {VENV}")
        session.run(sys.executable, "-m", "virtualenv", "--quiet", str(VENV), external=True)
    marker = VENV / ".dtbench-install"
    if marker.exists() and marker.read_text() == _digest(SHARED_EXTRAS):
        session.log(f"dependencies of {VENV} unchanged since the last install; skipping pip")
        return VENV_BIN
    session.log(f"installing dtbench[{SHARED_EXTRAS}] and its pinned dependencies (torch among them) into {VENV}: "
                "a few minutes the first time, skipped afterwards")
    session.run(str(python), "-m", "pip", "install", "-c", "constraints.txt", "-e", f".[{SHARED_EXTRAS}]",
                "--progress-bar", "off", external=True, silent=False)
    marker.write_text(_digest(SHARED_EXTRAS))
    return VENV_BIN


def _where_dtbench(session: nox.Session, bin_dir: Path) -> None:
    """Say where the dtbench command is, for the commands after the session."""
    session.log(f"the dtbench command: {bin_dir / 'dtbench'} (or `source {bin_dir / 'activate'}`, then `dtbench`)")


@nox.session(venv_backend="none")
def dev(session: nox.Session) -> None:
    """Make (or update) .venv with dtbench and its test tools, and say how to use its `dtbench` command."""
    _where_dtbench(session, shared_venv(session))


@nox.session(venv_backend="none")
def smoke(session: nox.Session) -> None:
    """Every method on the embedded default workload (suites/smoke.toml), then the report."""
    bin_dir = shared_venv(session)
    session.env.update({"MPLBACKEND": "Agg"})
    out = session.posargs[0] if session.posargs else "results"
    dtbench = str(bin_dir / "dtbench")
    # Exit 1 (some run failed or diverged) still gets its report, which lists the failures; the session fails after.
    # --overwrite: a smoke run again into the same folder runs every run again, the earlier results moved aside to
    # <out>/smoke/.earlier/<date>/ (kept, never deleted: docs/results.md).
    session.run(dtbench, "run", "suites/smoke.toml", "--out", out, "--overwrite", success_codes=[0, 1],
                external=True)
    session.run(dtbench, "report", f"{out}/smoke", external=True)
    _where_dtbench(session, bin_dir)
    session.log(f"the report: {Path(out, 'smoke', 'report', 'index.html').resolve()}")
    bad = _unfinished_runs(Path(out) / "smoke")
    if bad:
        session.error(f"{len(bad)} smoke runs did not complete (the report lists them): " + "; ".join(bad))
    missed = _missed_target(Path(out) / "smoke")
    if missed:
        session.error(f"{len(missed)} smoke runs completed without reaching their target (a configuration at "
                      "the edge of its stability; the report shows their curves): " + "; ".join(missed))


def _missed_target(suite_dir: Path) -> list[str]:
    """'<run id>: final accuracy <a>' (a language model's: 'final loss <l>') for every run of the report's
    summary.csv with no time to target."""
    import csv

    def final(row: dict[str, str]) -> str:
        if row.get("workload") == "shakespeare-gpt":
            return f"final loss {float(row['final_loss']):.3f}"
        return f"final accuracy {float(row['final_accuracy']):.3f}"

    with open(suite_dir / "report" / "summary.csv", newline="") as f:
        return [f"{row['run_id']}: {final(row)}" for row in csv.DictReader(f)
                if row["state"] == "completed" and not row["time_to_target_s"]]


def _unfinished_runs(suite_dir: Path) -> list[str]:
    """'<run id>: <state>' for every run folder of suite_dir whose status.json does not say completed."""
    import json

    bad = []
    for spec in sorted(suite_dir.glob("*/spec.json")):
        try:
            state = json.loads((spec.parent / "status.json").read_text()).get("state")
        except (OSError, ValueError):
            state = "no status.json"
        if state != "completed":
            bad.append(f"{spec.parent.name}: {state}")
    return bad


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite, in two pytest-xdist workers (`workers()`); pytest options after -- replace the defaults, e.g.
    `nox -s tests -- -m "not slow and not slurm"` (the quick lane, in one process)."""
    bin_dir = shared_venv(session)
    session.env.update({"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"})
    # No success_codes: pytest's exit 5 (no test collected or selected) fails the session, so that neither CI nor a
    # mistyped selection can pass having tested nothing.
    # `python -m pytest`, not the pytest script: a rank started from this process (through the warm forkserver)
    # re-runs the parent's __main__, and the script as __main__ (a path, run again at every rank's start) cost each
    # rank about 0.2 s; pytest's module as __main__ is named and already imported (measured 2026-12-07: 28 short runs
    # of tests/memory/test_memory_methods.py in 17.1 s, then 9.7 s).
    session.run(str(bin_dir / "python"), "-m", "pytest", *(session.posargs or ["-q", "-m", "not slurm", *workers()]),
                external=True)


def workers() -> list[str]:
    """pytest-xdist's options for the full run: two worker processes where there are two CPUs or more, each taking
    whole test files (--dist loadfile, so a module's fixture runs once); none on one CPU. Two, not one per CPU: the
    suite's multi-process tests start two or three ranks apiece, and two workers is what was measured (2026-12-07, 2
    cores: 6 min 56 s in one process, 4 min 34 s in two, 2,178 tests). Its own options after `--` replace these."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return ["-n", "2", "--dist", "loadfile"] if cpus >= 2 else []


SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server")


@nox.session(venv_backend="none")
def slurm(session: nox.Session) -> None:
    """The SLURM tests on a real local cluster: installs Debian's slurm, munge, slurmdbd and MariaDB packages (as
    root, with apt-get), then `pytest -m slurm`, whose test module starts munge, MariaDB, slurmdbd, slurmctld and
    two slurmd nodes with all state in a temp folder and stops them by PID (tests/slurm_cluster.py)."""
    if shutil.which("apt-get") is None:
        session.error("the slurm session installs Debian packages with apt-get; none here")
    missing = [name for name in SLURM_PACKAGES
               if subprocess.run(["dpkg", "-s", name], capture_output=True).returncode != 0]
    if missing:
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    bin_dir = shared_venv(session)
    session.env.update({"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"})
    # Its own pytest base folder: the jobs write into the tests' temp folders for minutes, and pytest prunes the
    # shared /tmp/pytest-of-<user> folders whenever other sessions start.
    basetemp = Path(session.create_tmp()) / "pytest"
    default = ["-q", "-m", "slurm", f"--basetemp={basetemp}", "--durations=10", "tests/launch/test_slurm_cluster.py"]
    session.run(str(bin_dir / "python"), "-m", "pytest", *(session.posargs or default), external=True)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """The GPU path (nccl, CUDA tensors): every smoke run that fits the GPUs (one rank per GPU) at 2 epochs, checked
    for completion, accuracy and data-parallel ranks' bitwise agreement (benchmarks/checks/gpu_check.py; pass its
    options after --). Without CUDA it says so in one line and succeeds."""
    bin_dir = shared_venv(session)
    session.env.update({"MPLBACKEND": "Agg"})
    session.run(str(bin_dir / "python"), "benchmarks/checks/gpu_check.py", *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")


# -- performance tracking (asv): docs/benchmarks.md -----------------------------------------------------------------

ASV_CONFIG = "asv.conf.json"
RESULTS_DIR = ROOT / ".asv" / "results"


def _commit(ref: str) -> str:
    """The full hash of a commit-ish (read-only git)."""
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"{ref!r} is not a commit of this repository")
    return done.stdout.strip()


def _stored_results(commit: str) -> list[Path]:
    """asv results files of `commit` (any machine, any environment), oldest first."""
    return sorted(RESULTS_DIR.glob(f"*/{commit[:8]}-*.json"), key=lambda path: path.stat().st_mtime)


def _asv_run(session: nox.Session, commit: str, asv_args: list[str], env: dict[str, str] | None = None) -> None:
    """asv run in this session's Python (an existing environment: offline), saved under `commit`."""
    python = Path(session.virtualenv.location) / "bin" / "python"
    session.run("asv", "machine", "--yes", "--config", ASV_CONFIG, silent=True)
    session.run("asv", "run", "--config", ASV_CONFIG, "--environment", f"existing:{python}",
                "--set-commit-hash", commit, "--show-stderr", "--durations", "5", *asv_args, env=env or {})


def _bench_options(session: nox.Session) -> tuple[argparse.Namespace, list[str]]:
    """The bench session's own options, and the rest (for `asv run`)."""
    parser = argparse.ArgumentParser(prog="nox -s bench --", allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--compare", metavar="REV")
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--bench", action="append", default=[], metavar="REGEX")
    parser.add_argument("--factor")
    parser.add_argument("--factor-for", action="append", default=[], metavar="GLOB=F")
    parser.add_argument("--strict", action="store_true")
    try:
        return parser.parse_known_args(session.posargs)
    except argparse.ArgumentError as err:
        session.error(f"{err}; usage: nox -s bench -- [--compare REV [--rerun] [--factor F] [--factor-for GLOB=F] "
                      "[--strict]] [--bench REGEX] [other asv run options]")


def _baseline(session: nox.Session, rev: str, rerun: bool, asv_args: list[str]) -> Path:
    """A copy of REV's results (measured first when not stored, when REV is HEAD, or with rerun), or REV's path."""
    if Path(rev).is_file():
        return Path(rev)
    try:
        base = _commit(rev)
    except ValueError as err:
        session.error(str(err))
    stored = _stored_results(base)
    if rerun or base == _commit("HEAD") or not stored:
        export = Path(session.create_tmp()) / f"export-{base[:8]}"
        shutil.rmtree(export, ignore_errors=True)
        export.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", base], cwd=ROOT, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(export, filter="data")
        session.log(f"measuring {rev} ({base[:8]}) from {export} with the working tree's benchmarks")
        # The slowdown switch is for the working tree only: the baseline runs without it.
        _asv_run(session, base, asv_args, env={"DTBENCH_BENCH_ROOT": str(export), "DTBENCH_BENCH_SLOWDOWN": "1"})
        stored = _stored_results(base)
    # A copy: measuring the working tree as HEAD overwrites HEAD's file when REV is HEAD.
    baseline = ROOT / ".asv" / "compare" / f"{base[:8]}.json"
    baseline.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(stored[-1], baseline)
    return baseline


@nox.session
def bench(session: nox.Session) -> None:
    """asv on the working tree, saved as the current commit in .asv/results, then the summary in .asv/summary.

    `-- --compare REV` then fails on a regression against REV beyond a factor (benchmarks/asv_tools/regress.py:
    --factor 1.25, --factor-for GLOB=F, --strict), measuring REV from a clean export when its results are not stored
    (or --rerun). `--bench REGEX` narrows both; other arguments go to `asv run`. DTBENCH_BENCH_SLOWDOWN=F slows the
    fixture benchmark of the working tree only, to check the check.
    """
    options, asv_extra = _bench_options(session)
    asv_args = [*(arg for regex in options.bench for arg in ("--bench", regex)), *asv_extra]
    install(session, "bench")
    session.env.update({"MPLBACKEND": "Agg"})
    baseline = _baseline(session, options.compare, options.rerun, asv_args) if options.compare else None
    head = _commit("HEAD")
    try:
        _asv_run(session, head, asv_args)
    finally:  # a failed benchmark still leaves the others' results, and the summary lists it
        session.run("python", "benchmarks/asv_tools/summary.py")
    if baseline is not None:
        regress_args = [*(arg for regex in options.bench for arg in ("--bench", regex)),
                        *(["--factor", options.factor] if options.factor else []),
                        *(arg for rule in options.factor_for for arg in ("--factor-for", rule)),
                        *(["--strict"] if options.strict else [])]
        session.run("python", "benchmarks/asv_tools/regress.py", str(baseline), head, *regress_args)
