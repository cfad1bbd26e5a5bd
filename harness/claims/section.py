"""The report's Claims section: the claim file beside a suite, judged on its summary table (claims.csv too)."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from harness.claims.display import claims_html
from harness.claims.evaluate import evaluate_claims
from harness.claims.model import load_claims
from harness.report.csvfile import write_csv
from harness.results import RunResult
from harness.suite.files import FileError


def claim_file_for(suite_dir: Path, runs: list[RunResult]) -> Path | None:
    """The claim file beside the suite: `<stem>.claims.toml` next to the suite file the runs were made from
    (spec.json's suite_file), else `<suite name>.claims.toml` in the results folder; None when there is neither."""
    for run in runs:
        suite_file = run.spec.get("suite_file")
        if isinstance(suite_file, str) and Path(suite_file).name:
            beside = Path(suite_file).with_name(f"{Path(suite_file).stem}.claims.toml")
            if _is_file(beside):
                return beside
    name = str(runs[0].spec.get("suite") or suite_dir.name) if runs else suite_dir.name
    inside = suite_dir / f"{name}.claims.toml"
    return inside if Path(name).name == name and _is_file(inside) else None


def _is_file(path: Path) -> bool:
    """Path.is_file, False too for a path the system refuses (too long, a NUL in it)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def claims_section(table: pd.DataFrame, path: Path, out_dir: Path) -> str:
    """The Claims section for the claim file at `path` (claims.csv written to out_dir), or the one-line error that
    kept it from being judged."""
    try:
        verdicts = evaluate_claims(table, load_claims(path), path)
    except FileError as exc:
        return f'<h2>Claims</h2>\n<p class="failure">The claim file could not be judged: {html.escape(str(exc))}</p>\n'
    write_csv(verdicts, out_dir / "claims.csv")
    return claims_html(verdicts, path)


def claims_page_section(suite_dir: Path, runs: list[RunResult], table: pd.DataFrame, out_dir: Path) -> str | None:
    """A SectionMaker (harness/report/build.py): the Claims section when a claim file sits beside the suite
    (claim_file_for), else None."""
    path = claim_file_for(suite_dir, runs)
    return None if path is None else claims_section(table, path, out_dir)
