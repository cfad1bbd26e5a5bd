"""Every apapo run that a shipped claim file judges has a pinned plan: the machine's load never picks the algorithm
a verdict is about (issue 37: on equal ranks the planner chose data parallelism, and a stale-update claim passed on
runs that made no stale update)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.claims.evaluate import matching_rows
from harness.claims.model import load_claims
from harness.suite.expand import expand_suite
from methods.pipeline.apapo.apapo import APapoParams

ROOT = Path(__file__).resolve().parents[2]
CLAIM_FILES = sorted((ROOT / "suites").glob("*.claims.toml"))


def judged_apapo_runs(claims_path: Path) -> list[tuple[str, str, APapoParams]]:
    """(claim id, label, params) of every apapo run that a claim of the file names as method or baseline."""
    suite = claims_path.with_name(claims_path.name.replace(".claims.toml", ".toml"))
    specs = expand_suite(suite, None, None)
    table = pd.DataFrame({"label": [s.label for s in specs], "method": [s.method for s in specs],
                          "network": [""] * len(specs)})
    found = []
    for claim in load_claims(claims_path).claim:
        for name in (claim.method, claim.baseline):
            for index in table.index[matching_rows(table, name)]:
                spec = specs[index]
                if spec.method == "apapo":
                    found.append((claim.id, spec.label, spec.params))
    return found


@pytest.mark.parametrize("claims_path", CLAIM_FILES, ids=lambda p: p.name)
def test_every_judged_apapo_run_has_a_pinned_plan(claims_path: Path) -> None:
    unpinned = [f"{claim_id}: {label!r}" for claim_id, label, params in judged_apapo_runs(claims_path)
                if not params.plan_pinned]
    assert not unpinned, (f"{claims_path.name} judges apapo runs whose plan the machine picks (set replicate = "
                          f"false, or rank_speeds and bandwidth): {', '.join(unpinned)}")


def test_the_check_finds_the_apapo_runs_and_fails_an_unpinned_one(tmp_path: Path) -> None:
    assert {label for _, label, _ in judged_apapo_runs(ROOT / "suites" / "apapo.claims.toml")} == {
        "apapo pipeline x2", "apapo pipeline x3 hetero"}
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-resnet"\nseeds = [0]\n[budget]\nmax_epochs = 1\n'
                     '[[run]]\nmethod = "ddp"\nworld_size = 2\n'
                     '[[run]]\nmethod = "apapo"\nworld_size = 2\n'
                     '[[run]]\nmethod = "apapo"\nlabel = "half"\nworld_size = 2\n'
                     'params = { rank_speeds = [1.0, 1.0] }\n')
    claims = tmp_path / "s.claims.toml"
    text = ('[[claim]]\nid = "{id}"\nsource = "p"\nstatement = "s"\nsetting = "scaled-down"\n'
            'metric = "final_accuracy"\nmethod = "{m}"\nbaseline = "ddp"\nrelation = "diff_ge"\nvalue = -0.01\n')
    claims.write_text(text.format(id="a", m="apapo x2") + text.format(id="b", m="half"))
    assert [(c, p.plan_pinned) for c, _, p in judged_apapo_runs(claims)] == [("a", False), ("b", False)]
    with pytest.raises(AssertionError, match=r"judges apapo runs whose plan the machine picks .*a: 'apapo x2'"):
        test_every_judged_apapo_run_has_a_pinned_plan(claims)
