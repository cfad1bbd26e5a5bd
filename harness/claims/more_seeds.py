"""Seeds until decided: which runs the undecided claims need more seeds of, run into the suite's own folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from harness.claims.evaluate import evaluate_claims, matching_rows
from harness.claims.model import ClaimFile
from harness.claims.sequential import Design
from harness.results import load_suite
from harness.suite.files import FileError
from harness.suite.spec import RunSpec


def wanted_seeds(table: pd.DataFrame, claims: ClaimFile, verdicts: pd.DataFrame) -> dict[str, int]:
    """label -> how many seeds of it the next looks need: for every claim whose row has a `next_look`, the labels
    of its method's and its baseline's runs (a claim whose control is undecided gets seeds through the control's
    own row)."""
    wanted: dict[str, int] = {}
    for claim, row in zip(claims.claim, verdicts.itertuples(), strict=True):
        if pd.isna(row.next_look):
            continue
        for name in (claim.method, claim.baseline):
            for label in pd.unique(table.loc[matching_rows(table, name), "label"].astype(str)):
                wanted[label] = max(wanted.get(label, 0), int(row.next_look))
    return wanted


def suite_file_of(suite_dir: Path, stored: list[tuple[str, str]]) -> Path:
    """The suite file the runs were made from (spec.json's suite_file, one for all; `stored`: each run folder's name
    and spec.json text), checked to exist: the extra seeds are expanded from it, so that they are the same runs with
    another seed. Raises FileError (one line)."""
    files = set()
    for _name, text in stored:
        try:
            files.add(json.loads(text).get("suite_file"))
        except (ValueError, AttributeError):
            continue
    files.discard(None)
    if len(files) != 1:
        raise FileError(f"{suite_dir}: the runs name {len(files)} suite files ({', '.join(map(str, files)) or 'none'}"
                        "): --until-decided adds seeds of the one suite file the runs were made from")
    path = Path(files.pop())
    if not path.is_file():
        raise FileError(f"{suite_dir}: the suite file the runs were made from, {path}, is not there: --until-decided "
                        "expands the added seeds from it (run from the folder the suite was run from)")
    return path


def seed_list(suite_seeds: list[int], count: int) -> list[int]:
    """The first `count` seeds: the suite's own, then the next integers past its largest."""
    seeds = list(dict.fromkeys(suite_seeds))
    while len(seeds) < count:
        seeds.append(max(seeds) + 1)
    return seeds[:count]


def until_decided(suite_dir: Path, claims: ClaimFile, claims_path: Path, design: Design,
                  judged: tuple[pd.DataFrame, pd.DataFrame], expand: Callable[[list[int]], list[RunSpec]],
                  suite_seeds: list[int], run: Callable[[list[RunSpec]], None],
                  say: Callable[[str], None]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From `judged` (the summary table and the claims judged on it under `design`): while some claim is undecided
    and its next look is within the design, run the seeds it needs of the labels behind it (`expand(seeds)`: the
    suite's specs with those seeds; `run`: runs them into suite_dir, keeping completed ones) and judge again.
    Returns the last (table, verdicts). Stops too when a round adds no pair to any claim (runs that fail again),
    saying so."""
    from harness.report import tables

    table, verdicts = judged
    judged_pairs: dict[str, int] | None = None
    while True:
        pairs = dict(zip(verdicts["id"], verdicts["pairs"], strict=True))
        wanted = wanted_seeds(table, claims, verdicts)
        if not wanted:
            return table, verdicts
        if judged_pairs is not None and pairs == judged_pairs:
            say("the added seeds gave no claim a new pair (their runs failed?): stopping with claims undecided")
            return table, verdicts
        judged_pairs = pairs
        specs = []
        for count in sorted(set(wanted.values())):
            labels = {label for label, n in wanted.items() if n == count}
            specs += [s for s in expand(seed_list(suite_seeds, count)) if s.label in labels]
        undecided = ", ".join(verdicts.loc[verdicts["next_look"].notna(), "id"])
        say(f"undecided: {undecided}; running seeds of {', '.join(sorted(wanted))} for the next look "
            f"({', '.join(f'{label}: {n} seeds' for label, n in sorted(wanted.items()))})")
        run(specs)
        table = tables.summary(load_suite(suite_dir))
        verdicts = evaluate_claims(table, claims, claims_path, design)
