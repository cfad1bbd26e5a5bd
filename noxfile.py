"""nox sessions: smoke (the main job), tests, lint and bench. Virtualenvs are reused, so torch installs once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent
INSTALL_INPUTS = ("pyproject.toml", "constraints.txt")


def install(session: nox.Session, extras: str) -> None:
    """Install dtbench (editable) with `extras`, pinned by constraints.txt; skipped when nothing changed since."""
    digest = hashlib.sha256(extras.encode())
    for name in INSTALL_INPUTS:
        digest.update((ROOT / name).read_bytes())
    marker = Path(session.virtualenv.location) / ".dtbench-install"
    if marker.exists() and marker.read_text() == digest.hexdigest():
        session.log("dependencies unchanged since the last install; skipping pip")
        return
    session.install("-c", "constraints.txt", "-e", f".[{extras}]" if extras else ".")
    marker.write_text(digest.hexdigest())


@nox.session
def smoke(session: nox.Session) -> None:
    """Every method on the embedded default workload (suites/smoke.toml), then the report."""
    install(session, "")
    session.env.update({"MPLBACKEND": "Agg"})
    out = session.posargs[0] if session.posargs else "results"
    session.run("dtbench", "run", "suites/smoke.toml", "--out", out)
    session.run("dtbench", "report", f"{out}/smoke")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (pass pytest options after --, e.g. `nox -s tests -- -m "not slow"`)."""
    install(session, "test")
    session.env.update({"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"})
    # pytest exits 5 when a selection matches no test: that is not a failure of the code.
    session.run("pytest", *(session.posargs or ["-q"]), success_codes=[0, 5])


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
