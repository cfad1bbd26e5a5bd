"""Seeds until decided: a claim file's [sequential] design judges each look on the first seeds at its share of the
error and keeps the first verdict; `dtbench claims --until-decided` runs the seeds the undecided claims need, of
their labels only, into the suite's folder, where `dtbench run --resume` and the stale check take them as seeds of
the suite; `dtbench run --seeds` runs chosen seeds."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from test_claims import claim, claim_file, write_run

from harness.claims.evaluate import evaluate_claims
from harness.claims.model import load_claims
from harness.cli.run import seeds_arg
from harness.report import tables
from harness.results import load_suite
from harness.suite.compare import against_suite


def judged(suite_dir: Path, path: Path):
    return evaluate_claims(tables.summary(load_suite(suite_dir)), load_claims(path), path).set_index("id")


def test_each_look_judges_the_first_seeds_and_the_first_decided_look_stands(tmp_path: Path) -> None:
    # bytes 1/100 of ddp's on every seed: decided at the first look; accuracy ddp's -0.02 +- 0.006 on seeds 0-2
    # ([-0.047, 0.007] at 98.3%: undecided), then -0.02 on seeds 3-5: FAIL at the look of 6 ([-0.025, -0.015])
    suite_dir = tmp_path / "results" / "fake"
    for seed in range(6):
        delta = (-0.02, -0.026, -0.014)[seed] if seed < 3 else -0.02
        write_run(suite_dir, "ddp", seed, 0.93, 10.0, 1000)
        write_run(suite_dir, "dgc", seed, 0.93 + delta, 5.0, 10)
    path = claim_file(tmp_path / "c.toml", claim("bytes", "total_bytes", "ratio_le", 0.02),
                      claim("accuracy", "final_accuracy", "diff_ge", -0.01))
    path.write_text("[sequential]\nmax_seeds = 10\n" + path.read_text())
    verdicts = judged(suite_dir, path)
    assert verdicts.loc["bytes", "verdict"] == "PASS" and verdicts.loc["bytes", "seeds"] == 3
    assert "decided at the look of 3 seeds" in verdicts.loc["bytes", "note"]
    assert verdicts.loc["accuracy", "verdict"] == "FAIL" and verdicts.loc["accuracy", "seeds"] == 6
    assert verdicts.loc["accuracy", "interval"] == "98.3% paired t, difference (3 looks, Bonferroni)"
    assert math.isnan(verdicts.loc["accuracy", "next_look"])
    # with 4 seeds only, the claim waits for the look of 6, and says so
    for seed in (4, 5):
        for method in ("ddp", "dgc"):
            (next(suite_dir.glob(f"{method}*-s{seed}")) / "status.json").write_text('{"state": "failed"}')
    verdicts = judged(suite_dir, path)
    assert verdicts.loc["accuracy", "verdict"] == "INCONCLUSIVE" and verdicts.loc["accuracy", "next_look"] == 6
    assert "undecided at 3 seeds; the next look needs 6" in verdicts.loc["accuracy", "note"]
    # without the design, one look at every pair at 95%: the same runs are judged on all 4 seeds
    plain = claim_file(tmp_path / "p.toml", claim("accuracy", "final_accuracy", "diff_ge", -0.01))
    row = judged(suite_dir, plain).loc["accuracy"]
    assert row["seeds"] == 4 and row["interval"] == "95% paired t, difference" and math.isnan(row["next_look"])


def test_a_bad_design_is_one_line_naming_the_field(tmp_path: Path, dtbench_here) -> None:
    path = claim_file(tmp_path / "c.toml", claim("bytes", "total_bytes", "ratio_le", 0.02))
    body = path.read_text()
    for table, field in (("max_seeds = 2", "sequential.max_seeds"), ("max_seeds = 10\nlooks = [3, 6]",
                                                                      "sequential: Value error, looks: must")):
        path.write_text(f"[sequential]\n{table}\n{body}")
        ran = dtbench_here("claims", tmp_path, path)
        assert ran.returncode == 2 and field in ran.stderr and len(ran.stderr.strip().splitlines()) == 1
    path.write_text(body)
    ran = dtbench_here("claims", tmp_path, path, "--until-decided")
    assert ran.returncode == 2 and "--until-decided needs a maximum" in ran.stderr
    ran = dtbench_here("claims", tmp_path, path, "--max-seeds", "5")
    assert ran.returncode == 2 and "only with --until-decided" in ran.stderr


@pytest.mark.parametrize(("text", "seeds"), [("3", [3]), ("3,4,5", [3, 4, 5]), ("0,4-6,5", [0, 4, 5, 6])])
def test_seeds_lists_and_ranges(text, seeds) -> None:
    assert seeds_arg(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "5-3", "-1", "0-100000"])
def test_bad_seeds_are_refused(text) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="expected seeds like"):
        seeds_arg(text)


SUITE = """name = "seq"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 1
[budget]
max_steps = 2
target_accuracy = 0.99
[defaults]
lr = 0.05
[[run]]
method = "sgd"
label = "a"
[[run]]
method = "sgd"
label = "b"
[[run]]
method = "sgd"
label = "c"
params = {lr = 0.1}
"""

CLAIMS = """[sequential]
max_seeds = 4

[[claim]]
id = "same-loss"
source = "a test"
statement = "a and b are the same run under two labels"
setting = "scaled-down"
metric = "final_loss"
method = "a"
baseline = "b"
relation = "absdiff_le"
value = 1e-9

[[claim]]
id = "never-decided"
source = "a test"
statement = "a reaches 0.99 no later than b (neither does in 2 steps: every time censored)"
setting = "scaled-down"
metric = "time_to_target_s"
method = "a"
baseline = "b"
relation = "ratio_le"
value = 1.0
"""


@pytest.mark.slow
def test_until_decided_runs_the_seeds_the_undecided_claims_need_into_the_suite_folder(tmp_path: Path,
                                                                                      dtbench_here) -> None:
    suite = tmp_path / "seq.toml"
    suite.write_text(SUITE)
    claims = tmp_path / "seq.claims.toml"
    claims.write_text(CLAIMS)
    out = tmp_path / "out"
    assert dtbench_here("run", suite, "--out", out, "--quiet").returncode == 0
    ran = dtbench_here("claims", out / "seq", claims, "--until-decided", "--quiet")
    assert ran.returncode == 0, ran.stderr
    # same-loss is decided at the look of 3 seeds; never-decided (both sides censored) goes on to the last look, 4
    with (out / "seq" / "report" / "claims.csv").open(newline="") as f:
        rows = {row["id"]: row for row in csv.DictReader(f)}
    assert rows["same-loss"]["verdict"] == "PASS" and rows["same-loss"]["seeds"] == "3"
    assert rows["never-decided"]["verdict"] == "INCONCLUSIVE" and rows["never-decided"]["seeds"] == "4"
    assert "undecided at 4 seeds, the last look (4)" in rows["never-decided"]["note"]
    assert "undecided: same-loss, never-decided" in ran.stderr
    runs = {json.loads(p.read_text())["label"] + f"-s{json.loads(p.read_text())['seed']}"
            for p in (out / "seq").glob("*/spec.json")}
    assert runs == {"a-s0", "a-s1", "a-s2", "a-s3", "b-s0", "b-s1", "b-s2", "b-s3", "c-s0"}  # c is behind no claim
    # the added seeds are seeds of the suite: the stale check finds none, and --resume keeps every run
    stored = [(p.parent.name, p.read_text()) for p in (out / "seq").glob("*/spec.json")]
    assert against_suite(suite, stored) == ([], None)
    again = dtbench_here("run", suite, "--out", out, "--resume", "--quiet")
    assert again.returncode == 0 and again.stdout.count("skipped (--resume)") == 3
    assert sorted(p.parent.name for p in (out / "seq").glob("*/spec.json")) == sorted(n for n, _ in stored)
    listing = dtbench_here("run", suite, "--out", out, "--resume", "--seeds", "0-3", "--dry-run")
    assert listing.returncode == 0 and listing.stdout.count("skipped (--resume)]") == 9
    assert listing.stdout.count("[new]") == 3  # seeds 1-3 of c, which no claim asked for
    # judging again without --until-decided gives the same verdicts: the design is the file's
    assert dtbench_here("claims", out / "seq", claims).returncode == 0
    with (out / "seq" / "report" / "claims.csv").open(newline="") as f:
        assert {row["id"]: row["seeds"] for row in csv.DictReader(f)} == {"same-loss": "3", "never-decided": "4"}
