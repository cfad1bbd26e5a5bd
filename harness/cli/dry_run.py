"""`dtbench run --dry-run`: each run's resolved params, and what the real run would do with its folder under --out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from harness.suite.spec import RunSpec, compact


def changed_params(spec: RunSpec) -> dict[str, Any]:
    """The run's resolved hyperparameters that differ from its method's own defaults (those the workload, the
    suite's [defaults] or the run's params set), in the method's field order; a field without a default always."""
    fields = type(spec.params).model_fields
    out = {}
    for name, value in spec.params.model_dump().items():
        info = fields.get(name)
        default = info.get_default(call_default_factory=True) if info is not None else PydanticUndefined
        if default is PydanticUndefined or value != default:
            out[name] = value
    return out


def listing(specs: list[RunSpec], out: Path, resume: bool, overwrite: bool = False) -> list[str]:
    """The lines of `dtbench run --dry-run`: one per run (run id, method, workload, world size, seed, the params
    that differ from the method's defaults, what happens to its folder, as harness/launch/suite.py's `decide` says
    for the real run), then the totals."""
    from harness.launch.suite import KINDS, decide, refusal

    lines, counts = [], dict.fromkeys(KINDS, 0)
    for spec in specs:
        params = " ".join(f"{k}={compact(v)}" for k, v in changed_params(spec).items()) or "(method defaults)"
        fate = decide(spec, out, resume)
        kind, words = fate.kind, fate.words
        counts[kind] += 1
        lines.append(f"{spec.run_id}\t{spec.method}\t{spec.workload}\tworld_size={spec.world_size}\tseed={spec.seed}"
                     f"\tparams: {params}\t[{words}]")
    suite_dir = out / specs[0].suite if specs else out
    lines.append(f"{len(specs)} runs; nothing written (--dry-run). params: the resolved hyperparameters that differ "
                 "from each method's defaults (spec.json records them all).")
    refused = None if resume or overwrite else refusal(specs, out)
    lines.append(f"The real run would refuse: {refused}" if refused else totals(counts, suite_dir, len(specs)))
    return lines


def totals(counts: dict[str, int], suite_dir: Path, runs: int) -> str:
    """The closing sentence: what the real run would do to the folders already under `suite_dir`."""
    from harness.launch.suite import NEW, REPLACES, RERUNS, RESTARTS, RESUMES, SKIPS

    if counts[NEW] == runs:
        return f"The real run would write {runs} new run folders in {suite_dir}."
    parts = [f"{verb} {counts[kind]}{what}" for kind, verb, what in
             ((SKIPS, "keep", " completed"), (RESUMES, "resume", " in their folders"),
              (RERUNS, "run again", " whose spec changed"), (RESTARTS, "start", " over"),
              (REPLACES, "replace", " earlier"), (NEW, "write", " new")) if counts[kind]]
    moved = counts[RERUNS] + counts[RESTARTS] + counts[REPLACES]
    aside = f"; {moved} earlier folders would be moved aside to {suite_dir}/.earlier/<date>/" if moved else ""
    return f"The real run would {', '.join(parts)} in {suite_dir}{aside}."
