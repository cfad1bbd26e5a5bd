"""The page's warning for runs whose spec.json is not what the suite.toml beside them asks for (found by
harness/suite/compare.py's against_suite, which `dtbench report` runs): kept from an earlier version of the suite, e.g.
by `--resume --only` after an edit."""

from __future__ import annotations

import html


def stale_html(found: list[tuple[str, str]], problem: str | None) -> str:
    """The warning naming each (run folder, what differs) in `found`, or saying why the check failed; '' for none."""
    if problem:
        return f'<p class="warning"><b>Runs not checked against the suite.</b> {html.escape(problem)}</p>\n'
    if not found:
        return ""
    items = "".join(f"<li><code>{html.escape(name)}</code>: {html.escape(what)}</li>" for name, what in found)
    return (f'<p class="warning"><b>Runs that the suite.toml beside them no longer asks for.</b> {len(found)} run '
            "folder(s) hold results of another spec than suite.toml gives their run id (kept from an earlier version "
            "of the suite; <code>dtbench run SUITE --resume</code> runs them again). Their numbers are in the tables "
            "and plots below as they ran (suite.toml value -&gt; the run's):</p>\n"
            f'<ul class="warning">{items}</ul>\n')
