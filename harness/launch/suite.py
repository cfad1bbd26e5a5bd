"""Running a whole suite: what happens to each run's folder (new, kept by --resume when its spec is unchanged,
continued from a checkpoint, or replaced with the earlier one moved aside), the refusal to replace completed results
unasked, progress, and the closing summary."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from harness.launch.aside import EARLIER, SUITE_FILE, Aside
from harness.launch.local import LaunchResult, launch
from harness.launch.progress import RunBar
from harness.run import checkpoint_files
from harness.run.records import write_json
from harness.suite import compare
from harness.suite.spec import RunSpec


@dataclass
class RunOutcome:
    spec: RunSpec
    state: str
    error: dict | None
    seconds: float


class ResultsExist(RuntimeError):
    """The suite folder holds completed results of these runs, and neither --resume nor --overwrite was given."""


#: What a run of the suite does with its folder (decide's kinds, in the order the dry run's totals name them).
NEW, SKIPS, RESUMES, RESTARTS, RERUNS, REPLACES = "new", "skips", "resumes", "restarts", "reruns", "replaces"
KINDS = (NEW, SKIPS, RESUMES, RESTARTS, RERUNS, REPLACES)


@dataclass
class Fate:
    """What happens to one run's folder: `kind` (NEW ... REPLACES) and the words a person reads (for RESUMES, the
    launcher's checkpoint choice, which may be none valid: the run then restarts at step 0 in its folder). Every kind
    but NEW, SKIPS and RESUMES moves an existing folder aside first (Aside)."""

    kind: str
    words: str


def is_completed(run_dir: Path) -> bool:
    """Whether the run has ended for good: completed, or refused by its memory_per_rank (its plan does not change)."""
    try:
        return json.loads((run_dir / "status.json").read_text()).get("state") in ("completed", "does_not_fit")
    except (OSError, ValueError):
        return False


def spec_change(run_dir: Path, spec: RunSpec) -> str | None:
    """None when run_dir/spec.json asks for exactly `spec` (provenance aside: harness/suite/compare.py); else the
    fields that differ, with both values, or why the stored spec cannot be compared."""
    try:
        stored = compare.stored_spec((run_dir / "spec.json").read_text(encoding="utf-8"))
    except OSError as exc:
        return f"its spec.json cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # pydantic's ValidationError, or bytes that are not UTF-8
        return f"its spec.json does not read as a spec ({str(exc).splitlines()[0]})"
    return compare.describe(stored, spec) if compare.differences(stored, spec) else None


def resume_choice(run_dir: Path, spec: RunSpec) -> checkpoint_files.Choice | None:
    """What --resume continues `spec` from: None when run_dir holds no checkpoint files of an attempt of `spec`
    (the run starts over in a fresh folder); else the newest checkpoint whose sha256 and spec hash verify, or a
    Choice of no file (the run restarts at step 0 in its folder, and says so), with the files rejected and why.
    The worker's rank 0 makes the same choice again before it loads, and loads it (harness/run/worker.py): what
    it loaded is what the console reports in the end (resumed_from)."""
    if not checkpoint_files.present(run_dir) or spec_change(run_dir, spec) is not None:
        return None
    return checkpoint_files.choose(run_dir, checkpoint_files.spec_hash(spec.model_dump_json()))


def decide(spec: RunSpec, out: Path, resume: bool) -> Fate:
    """What `dtbench run` does with out/<suite>/<run id>/ (the real run and --dry-run both ask this; it reads,
    never writes). Without --resume an existing folder is replaced (moved aside; run_specs refuses first where
    one holds completed results and --overwrite was not given). With --resume a completed run is kept only when its
    stored spec is the one asked for now, else it runs again; an unfinished one continues from its newest valid
    checkpoint of the same spec, else starts over."""
    run_dir = out / spec.suite / spec.run_id
    if not run_dir.is_dir():
        return Fate(NEW, "new")
    if not resume:
        return Fate(REPLACES, "replaces an earlier run (moved aside)")
    if is_completed(run_dir):
        change = spec_change(run_dir, spec)
        if change is None:
            return Fate(SKIPS, "completed earlier: skipped (--resume)")
        return Fate(RERUNS, f"completed earlier with another spec ({change}): runs again, the earlier results moved "
                            "aside (--resume)")
    choice = resume_choice(run_dir, spec)
    if choice is not None:  # in its folder: from the newest valid checkpoint, or from step 0 past damaged ones
        return Fate(RESUMES, f"{choice.describe()} (--resume)")
    return Fate(RESTARTS, "starts over, the earlier attempt moved aside: no checkpoint of this spec (--resume)")


def refusal(specs: list[RunSpec], out: Path) -> str | None:
    """The one line that refuses a run of `specs` into `out` without --resume or --overwrite, where some of their
    folders hold completed results; None when none does (failed or unfinished attempts are moved aside)."""
    done = [out / s.suite / s.run_id for s in specs if is_completed(out / s.suite / s.run_id)]
    if not done:
        return None
    newest = max(p.stat().st_mtime for p in done)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(newest))
    return (f"{out / specs[0].suite}: holds completed results of {len(done)} of these {len(specs)} runs (last "
            f"written {when}); use --resume to keep them (runs whose spec changed run again), --overwrite to move "
            f"them aside to {out / specs[0].suite / EARLIER}/<date>/ and run all again, or another --out")


def prepare_run_dir(spec: RunSpec, out: Path, aside: Aside | None = None) -> Path:
    """A fresh folder for the run holding its spec.json. An earlier folder of the run is moved aside (`aside`, by
    default one of its own), never deleted."""
    run_dir = out / spec.suite / spec.run_id
    if run_dir.exists():
        (aside or Aside(out / spec.suite)).move(run_dir)
    run_dir.mkdir(parents=True)
    write_json(run_dir / "spec.json", spec.model_dump(mode="json"))
    return run_dir


def run_specs(specs: list[RunSpec], out: Path, resume: bool = False, argv: list[str] | None = None,
              suite_file: Path | None = None, show_progress: bool = True, overwrite: bool = False,
              lock_fd: int | None = None) -> list[RunOutcome]:
    """Run every spec in order with the local launcher. A failed run is reported and the suite goes on.

    Each run's folder is handled as `decide` says. Without `resume` or `overwrite`, ResultsExist (nothing
    written) when some of the runs' folders hold completed results. `lock_fd`: the suite folder's lock, which the
    ranks hold too (harness/launch/tether.py).
    """
    if not specs:
        return []
    suite_dir, aside = _begin(specs, out, resume or overwrite, suite_file)
    outcomes: list[RunOutcome] = []
    for i, spec in enumerate(specs, 1):
        prefix = f"[{i}/{len(specs)}] {spec.run_id}"
        fate = decide(spec, out, resume)
        run_dir = suite_dir / spec.run_id
        if fate.kind == SKIPS:
            status = json.loads((run_dir / "status.json").read_text())
            state = status["state"]
            tqdm.write(f"{prefix}: {state.replace('_', ' ')} earlier, skipped (--resume)")
            outcomes.append(RunOutcome(spec, state, status.get("error"), 0.0))
            continue
        if fate.kind == RESUMES:  # rank 0 checks and loads the file itself: the run's last line names the one used
            tqdm.write(f"{prefix}: resuming in its folder (--resume)")
        elif fate.kind in (RERUNS, RESTARTS):
            tqdm.write(f"{prefix}: {fate.words}")
        try:
            if fate.kind != RESUMES:
                run_dir = prepare_run_dir(spec, out, aside)
            result = _launch_with_progress(spec, run_dir, prefix, argv, show_progress, fate.kind == RESUMES, lock_fd)
        except OSError as exc:  # the results folder cannot be written (a full disk, no permission, ...)
            where = exc.filename or run_dir
            error = {"message": f"cannot write {where}: {exc.strerror or exc}; the run's files are incomplete",
                     "rank": None}
            result = LaunchResult("failed", error, 0.0)
        line = f"{prefix}: {result.state} in {result.seconds:.1f} s"
        if fate.kind == RESUMES:
            line += f" ({resumed_from(run_dir)})"
        if result.error:
            line += f" ({result.error.get('message')})"
        tqdm.write(line)
        outcomes.append(RunOutcome(spec, result.state, result.error, result.seconds))
    note = aside.note()
    if note:
        tqdm.write(note)
    return outcomes


def _begin(specs: list[RunSpec], out: Path, asked: bool, suite_file: Path | None) -> tuple[Path, Aside]:
    """What every run of a suite into `out` does first: refuse (ResultsExist, nothing written) where some of the
    runs' folders hold completed results and neither --resume nor --overwrite was `asked`; make the suite folder and
    its Aside (before suite.toml is replaced: the moved runs keep the one they ran under); copy the suite file in."""
    if not asked:
        line = refusal(specs, out)
        if line:
            raise ResultsExist(line)
    suite_dir = out / specs[0].suite
    aside = Aside(suite_dir)
    suite_dir.mkdir(parents=True, exist_ok=True)
    if suite_file is not None:
        shutil.copyfile(suite_file, suite_dir / SUITE_FILE)
    return suite_dir, aside


def resumed_from(run_dir: Path) -> str:
    """What the run's rank 0 actually continued from, as its status.json records it (rank 0 also loads the file,
    and rejects one that verifies but does not load, so it may differ from the launcher's choice)."""
    try:
        record = json.loads((run_dir / "status.json").read_text()).get("resume")
    except (OSError, ValueError, AttributeError):
        record = None
    if not isinstance(record, dict):
        return "rank 0 recorded no checkpoint choice"
    return checkpoint_files.Choice.from_record(record).describe()


def _launch_with_progress(spec: RunSpec, run_dir: Path, desc: str, argv: list[str] | None, show: bool,
                          resume: bool = False, lock_fd: int | None = None) -> LaunchResult:
    """Launch with a progress bar (epochs done, last accuracy) on an interactive terminal; none in logs."""
    bar = RunBar(spec.budget.max_epochs, desc, show)
    try:
        return launch(spec, run_dir, bar.update, argv, resume, lock_fd)
    finally:
        bar.close()


def submit_specs(specs: list[RunSpec], out: Path, site, resume: bool = False, argv: list[str] | None = None,
                 suite_file: Path | None = None, overwrite: bool = False) -> list:
    """Prepare the run folders as run_specs does (`decide`, the refusal without --resume or --overwrite, earlier
    folders moved aside) and submit the runs to SLURM at once.

    Returns harness.launch.slurm.Submitted items; completed runs that --resume keeps are not submitted.
    """
    from harness.launch.slurm import submit

    suite_dir, aside = _begin(specs, out, resume or overwrite, suite_file)
    runs = []
    for spec in specs:
        fate = decide(spec, out, resume)
        run_dir = suite_dir / spec.run_id
        if fate.kind != NEW:
            print(f"{spec.run_id}: {fate.words}")
        if fate.kind == SKIPS:
            continue
        if fate.kind != RESUMES:
            run_dir = prepare_run_dir(spec, out, aside)
        runs.append((spec, run_dir))
    note = aside.note()
    if note:
        print(note)
    return submit(runs, suite_dir, site, list(argv or [])) if runs else []
