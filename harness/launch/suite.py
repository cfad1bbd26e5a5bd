"""Running a whole suite: run folders, --resume (skip finished runs, continue from checkpoints), progress, and the
closing summary."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from harness.launch.local import LaunchResult, launch
from harness.launch.progress import RunBar
from harness.run import checkpoint_files
from harness.run.records import write_json
from harness.suite.spec import RunSpec


@dataclass
class RunOutcome:
    spec: RunSpec
    state: str
    error: dict | None
    seconds: float


def prepare_run_dir(spec: RunSpec, out: Path) -> Path:
    """A clean folder for the run holding its spec.json (an earlier attempt's files are removed)."""
    run_dir = out / spec.suite / spec.run_id
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    write_json(run_dir / "spec.json", spec.model_dump(mode="json"))
    return run_dir


def is_completed(run_dir: Path) -> bool:
    """Whether the run has ended for good: completed, or refused by its memory_per_rank (its plan does not change)."""
    try:
        return json.loads((run_dir / "status.json").read_text()).get("state") in ("completed", "does_not_fit")
    except (OSError, ValueError):
        return False


def resumable(run_dir: Path, spec: RunSpec) -> bool:
    """Whether an earlier attempt of `spec` left checkpoint files in `run_dir` (valid or not: resume_choice says)."""
    try:
        same = RunSpec.model_validate_json((run_dir / "spec.json").read_text()) == spec
    except (OSError, ValueError):
        return False
    return same and checkpoint_files.present(run_dir)


def resume_choice(run_dir: Path, spec: RunSpec) -> checkpoint_files.Choice | None:
    """What --resume continues `spec` from: None when run_dir holds no checkpoint files of an attempt of `spec`
    (the run starts over in a clean folder); else the newest checkpoint whose sha256 and spec hash verify, or a
    Choice of no file (the run restarts at step 0 in its folder, and says so), with the files rejected and why.
    The worker's rank 0 makes the same choice again before it loads (harness/run/worker.py)."""
    if not resumable(run_dir, spec):
        return None
    return checkpoint_files.choose(run_dir, checkpoint_files.spec_hash(spec.model_dump_json()))


def replaced_note(specs: list[RunSpec], out: Path) -> str | None:
    """The line a new run of a suite prints when it replaces earlier results: how many of its runs' folders already
    exist (each is removed when its run starts) and when they last ran; None when none does. Folders of runs that
    are not in `specs` are left alone."""
    earlier = [out / s.suite / s.run_id for s in specs if (out / s.suite / s.run_id).is_dir()]
    if not earlier:
        return None
    newest = max(p.stat().st_mtime for p in earlier)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(newest))
    return (f"{out / specs[0].suite}: replaces the results of {len(earlier)} of these {len(specs)} runs from an "
            f"earlier run (last written {when}); use --resume to keep completed runs, or another --out")


def run_specs(specs: list[RunSpec], out: Path, resume: bool = False, argv: list[str] | None = None,
              suite_file: Path | None = None, show_progress: bool = True) -> list[RunOutcome]:
    """Run every spec in order with the local launcher. A failed run is reported and the suite goes on.

    With `resume`, completed runs are skipped, runs with a checkpoint of the same spec continue from the newest one
    that verifies (resume_choice; a run whose checkpoints all fail restarts at step 0 and says so), and the others
    start over.
    """
    outcomes: list[RunOutcome] = []
    if not resume and specs:
        note = replaced_note(specs, out)
        if note:
            tqdm.write(note)
    if suite_file is not None and specs:
        (out / specs[0].suite).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(suite_file, out / specs[0].suite / "suite.toml")
    for i, spec in enumerate(specs, 1):
        run_dir = out / spec.suite / spec.run_id
        if resume and is_completed(run_dir):
            status = json.loads((run_dir / "status.json").read_text())
            state = status["state"]
            tqdm.write(f"[{i}/{len(specs)}] {spec.run_id}: {state.replace('_', ' ')} earlier, skipped (--resume)")
            outcomes.append(RunOutcome(spec, state, status.get("error"), 0.0))
            continue
        choice = resume_choice(run_dir, spec) if resume else None
        go_on = choice is not None
        if go_on:
            tqdm.write(f"[{i}/{len(specs)}] {spec.run_id}: {choice.describe()} (--resume)")
        try:
            if not go_on:
                run_dir = prepare_run_dir(spec, out)
            result = _launch_with_progress(spec, run_dir, f"[{i}/{len(specs)}] {spec.run_id}", argv,
                                          show_progress, go_on)
        except OSError as exc:  # the results folder cannot be written (a full disk, no permission, ...)
            where = exc.filename or run_dir
            error = {"message": f"cannot write {where}: {exc.strerror or exc}; the run's files are incomplete",
                     "rank": None}
            result = LaunchResult("failed", error, 0.0)
        line = f"[{i}/{len(specs)}] {spec.run_id}: {result.state} in {result.seconds:.1f} s"
        if result.error:
            line += f" ({result.error.get('message')})"
        tqdm.write(line)
        outcomes.append(RunOutcome(spec, result.state, result.error, result.seconds))
    return outcomes


def _launch_with_progress(spec: RunSpec, run_dir: Path, desc: str, argv: list[str] | None, show: bool,
                          resume: bool = False) -> LaunchResult:
    """Launch with a progress bar (epochs done, last accuracy) on an interactive terminal; none in logs."""
    bar = RunBar(spec.budget.max_epochs, desc, show)
    try:
        return launch(spec, run_dir, bar.update, argv, resume)
    finally:
        bar.close()


def submit_specs(specs: list[RunSpec], out: Path, site, resume: bool = False, argv: list[str] | None = None,
                 suite_file: Path | None = None) -> list:
    """Prepare the run folders (as run_specs does, --resume included) and submit the runs to SLURM at once.

    Returns harness.launch.slurm.Submitted items; completed runs skipped by --resume are not submitted.
    """
    from harness.launch.slurm import submit

    suite_dir = out / specs[0].suite
    suite_dir.mkdir(parents=True, exist_ok=True)
    if suite_file is not None:
        shutil.copyfile(suite_file, suite_dir / "suite.toml")
    runs = []
    for spec in specs:
        run_dir = suite_dir / spec.run_id
        if resume and is_completed(run_dir):
            print(f"{spec.run_id}: completed earlier, skipped (--resume)")
            continue
        choice = resume_choice(run_dir, spec) if resume else None
        if choice is not None:
            print(f"{spec.run_id}: {choice.describe()} (--resume)")
        else:
            run_dir = prepare_run_dir(spec, out)
        runs.append((spec, run_dir))
    return submit(runs, suite_dir, site, list(argv or [])) if runs else []
