"""`dtbench run --dry-run`: each run's resolved params, and what the real run would do with its folder under --out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from harness import registry
from harness.suite.spec import RunSpec, compact

#: What the real run does with one run's folder (the keys of `fate`'s answers, and the order the totals name them).
NEW, REPLACES, SKIPS, RESUMES, RESTARTS = "new", "replaces", "skips", "resumes", "restarts"


def changed_params(spec: RunSpec) -> dict[str, Any]:
    """The run's resolved hyperparameters that differ from its method's own defaults (those the workload, the
    suite's [defaults] or the run's params set), in the method's field order; a field without a default always."""
    fields = registry.METHODS.get(spec.method).Params.model_fields
    out = {}
    for name, value in spec.params.items():
        info = fields.get(name)
        default = info.get_default(call_default_factory=True) if info is not None else PydanticUndefined
        if default is PydanticUndefined or value != default:
            out[name] = value
    return out


def fate(spec: RunSpec, out: Path, resume: bool) -> tuple[str, str]:
    """(what the real run does with `out/<suite>/<run id>/`: one of NEW, REPLACES, SKIPS, RESUMES, RESTARTS; the
    words the listing shows), decided as harness/launch/suite.py's run_specs decides it. Reads, never writes."""
    from harness.launch.suite import is_completed, resume_choice

    run_dir = out / spec.suite / spec.run_id
    if not run_dir.is_dir():
        return NEW, "new"
    if not resume:
        return REPLACES, "replaces an earlier run"
    if is_completed(run_dir):
        return SKIPS, "completed earlier: skipped (--resume)"
    choice = resume_choice(run_dir, spec)
    if choice is not None and choice.file is not None:
        return RESUMES, f"{choice.describe()} (--resume)"
    why = f": {choice.describe()}" if choice is not None else ": no checkpoint of this spec"
    return RESTARTS, f"starts over, replacing an earlier attempt{why} (--resume)"


def listing(specs: list[RunSpec], out: Path, resume: bool) -> list[str]:
    """The lines of `dtbench run --dry-run`: one per run (run id, method, workload, world size, seed, the params
    that differ from the method's defaults, what happens to its folder), then the totals."""
    lines, counts = [], dict.fromkeys((NEW, REPLACES, SKIPS, RESUMES, RESTARTS), 0)
    for spec in specs:
        params = " ".join(f"{k}={compact(v)}" for k, v in changed_params(spec).items()) or "(method defaults)"
        kind, words = fate(spec, out, resume)
        counts[kind] += 1
        lines.append(f"{spec.run_id}\t{spec.method}\t{spec.workload}\tworld_size={spec.world_size}\tseed={spec.seed}"
                     f"\tparams: {params}\t[{words}]")
    suite_dir = out / specs[0].suite if specs else out
    lines.append(f"{len(specs)} runs; nothing written (--dry-run). params: the resolved hyperparameters that differ "
                 "from each method's defaults (spec.json records them all).")
    lines.append(totals(counts, suite_dir, len(specs)))
    return lines


def totals(counts: dict[str, int], suite_dir: Path, runs: int) -> str:
    """The closing sentence: what the real run would do to the folders already under `suite_dir`."""
    if counts[NEW] == runs:
        return f"The real run would write {runs} new run folders in {suite_dir}."
    new = f" and write {counts[NEW]} new" if counts[NEW] else ""
    if counts[REPLACES]:
        return (f"The real run would replace {counts[REPLACES]} earlier runs in {suite_dir}{new}; use --resume to "
                "keep completed runs, or another --out.")
    parts = [f"{verb} {counts[kind]}{what}" for kind, verb, what in
             ((SKIPS, "skip", " completed"), (RESUMES, "resume", " from a checkpoint"),
              (RESTARTS, "start", " over"), (NEW, "write", " new")) if counts[kind]]
    return f"With --resume the real run would {', '.join(parts)} in {suite_dir}."
