"""Runs whose spec.json is not what the suite.toml beside them asks for (a run kept from an earlier version of the
suite, e.g. by `--resume --only` after an edit): the page names them, with the fields that differ."""

from __future__ import annotations

import html
import warnings
from pathlib import Path

from harness.results import RunResult

#: Fields a launch option sets on every run without the suite file (--nodes on SLURM): not a difference of the suite.
LAUNCH_FIELDS = frozenset({"nodes"})


def stale_runs(suite_dir: Path, runs: list[RunResult]) -> tuple[list[tuple[str, str]], str | None]:
    """([(run folder, what differs)], or a reason the check could not be made). Each run's spec.json is compared
    (harness/suite/compare.py) with the spec suite_dir/suite.toml expands to for the same run id; a run launched with
    --network is compared with the suite expanded under its own network. No suite.toml: nothing to check."""
    from harness.suite import compare
    from harness.suite.files import FileError

    suite_file = suite_dir / "suite.toml"
    if not suite_file.is_file():
        return [], None
    expansions: dict[str, dict] = {}

    def expanded(network) -> dict:
        key = network.model_dump_json() if network is not None else ""
        if key not in expansions:
            from harness.suite.expand import expand_suite

            with warnings.catch_warnings():  # the machine's warnings (cores, threads) are the run's business
                warnings.simplefilter("ignore")
                expansions[key] = {s.run_id: s for s in expand_suite(suite_file, None, network)}
        return expansions[key]

    found = []
    try:
        plain = expanded(None)
        for run in runs:
            try:
                stored = compare.stored_spec(run.spec)
            except ValueError as exc:
                found.append((run.run_dir.name, f"its spec.json does not read as a spec ({str(exc).splitlines()[0]})"))
                continue
            wanted = plain.get(stored.run_id)
            if wanted is None and stored.network is not None:
                wanted = expanded(stored.network).get(stored.run_id)
            if wanted is None:
                found.append((run.run_dir.name, "suite.toml has no such run"))
                continue
            wanted = wanted.model_copy(update={field: getattr(stored, field) for field in LAUNCH_FIELDS})
            if compare.differences(stored, wanted):
                found.append((run.run_dir.name, compare.describe(wanted, stored)))
    except FileError as exc:
        return [], f"the runs could not be checked against {suite_file}: {exc}"
    return found, None


def stale_html(suite_dir: Path, runs: list[RunResult]) -> str:
    """The page's warning naming the runs stale_runs finds (or why the check failed), or ''."""
    found, problem = stale_runs(suite_dir, runs)
    if problem:
        return f'<p class="warning"><b>Runs not checked against the suite.</b> {html.escape(problem)}</p>\n'
    if not found:
        return ""
    items = "".join(f"<li><code>{html.escape(name)}</code>: {html.escape(what)}</li>" for name, what in found)
    return (f'<p class="warning"><b>Runs that the suite.toml beside them no longer asks for.</b> {len(found)} run '
            "folder(s) hold results of another spec than suite.toml gives their run id (kept from an earlier version "
            "of the suite; <code>dtbench run SUITE --resume</code> runs them again). Their numbers are in the tables "
            f"and plots below as they ran (suite.toml value -&gt; the run's):</p>\n<ul class=\"warning\">{items}</ul>\n")
