"""Claims on synthetic results: a true claim PASSes, a false one FAILs, a borderline one is INCONCLUSIVE; few seeds
and noisy times are never judged; bad claim files exit 2 with one line; the report shows the Claims section."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.claims import display
from harness.claims.evaluate import CLAIM_COLUMNS, evaluate_claims, verdict
from harness.claims.model import load_claims
from harness.cli import main
from harness.report import build, tables
from harness.results import load_suite
from harness.suite.files import FileError

ROOT = Path(__file__).resolve().parents[2]

TARGET = 0.9


def write_run(suite_dir: Path, method: str, seed: int, accuracy: float, seconds: float, bytes_per_step: int,
              label: str | None = None, noisy: bool = False, network: dict | None = None) -> None:
    """One 2-rank run: 10 steps of 64 samples, bytes_per_step sent by each rank per step, evaluations at 0 and at
    the end (reaching `accuracy` at `seconds` of train time), and each rank's `cpu` record (starved by another
    process when `noisy`)."""
    label = label or f"{method} x2"
    run_id = f"{label.replace(' ', '_')}-s{seed}"
    run_dir = suite_dir / run_id
    run_dir.mkdir(parents=True)
    spec = {"suite": "fake", "run_id": run_id, "label": label, "method": method, "family": "data-parallel",
            "workload": "digits-mlp", "world_size": 2, "seed": seed, "params": {}, "network": network,
            "budget": {"max_epochs": 1, "target_accuracy": TARGET}, "suite_file": str(suite_dir.parent / "fake.toml")}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    (run_dir / "status.json").write_text(json.dumps({"state": "completed", "error": None, "final": {}}))
    lines = [{"kind": "eval", "rank": 0, "wall_time_s": 0.1, "train_time_s": 0.0, "step": 0, "epoch": 0.0,
              "samples": 0, "test_accuracy": 0.1, "test_loss": 2.3}]
    for rank in (0, 1):
        lines.append({"kind": "train", "rank": rank, "wall_time_s": seconds, "train_time_s": seconds, "step": 10,
                      "epoch": 1.0, "samples": 640, "loss": 0.1, "bytes_sent": 10 * bytes_per_step,
                      "bytes_recv": 10 * bytes_per_step})
    lines.append({"kind": "eval", "rank": 0, "wall_time_s": seconds + 0.1, "train_time_s": seconds, "step": 10,
                  "epoch": 1.0, "samples": 640, "test_accuracy": accuracy, "test_loss": 0.3})
    for rank in (0, 1):
        wait = 2.0 if noisy else 0.01
        lines.append({"kind": "cpu", "rank": rank, "wall_time_s": seconds + 0.2, "train_time_s": seconds,
                      "wall_s": 2.0, "cpu_s": 1.0, "wait_s": wait, "threads": 1, "host": "h", "cores": 2,
                      "machine_busy_s": 3.5 if noisy else 2.05, "machine_steal_s": 0.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """ddp and dgc on three seeds: dgc sends exactly 1/100 of ddp's bytes; its accuracy is ddp's +0.01, -0.01 and
    0; its time is ddp's x0.5, x0.6 and x0.55. sgd has two seeds only."""
    suite_dir = tmp_path / "results" / "fake"
    for seed, (delta, speed) in enumerate([(0.01, 0.5), (-0.01, 0.6), (0.0, 0.55)]):
        write_run(suite_dir, "ddp", seed, 0.93 + 0.002 * seed, 10.0 + seed, 1000)
        write_run(suite_dir, "dgc", seed, 0.93 + 0.002 * seed + delta, (10.0 + seed) * speed, 10)
    for seed in (0, 1):
        write_run(suite_dir, "sgd", seed, 0.94, 8.0, 0, label="sgd x1")
    return suite_dir


def claim_file(path: Path, *claims: str, suite: str | None = None) -> Path:
    head = f'suite = "{suite}"\n' if suite else ""
    path.write_text(head + "".join(f"[[claim]]\n{claim}\n" for claim in claims))
    return path


def claim(id: str, metric: str, relation: str, value: float, method: str = "dgc", baseline: str = "ddp") -> str:
    return (f'id = "{id}"\nsource = "a paper"\nstatement = "{id} holds"\nsetting = "scaled-down"\n'
            f'metric = "{metric}"\nmethod = "{method}"\nbaseline = "{baseline}"\nrelation = "{relation}"\n'
            f"value = {value}\n")


def judge(suite: Path, tmp_path: Path, *claims: str) -> pd.DataFrame:
    table = tables.summary(load_suite(suite))
    path = claim_file(tmp_path / "c.toml", *claims)
    return evaluate_claims(table, load_claims(path), path).set_index("id")


def test_true_false_and_borderline_claims(suite: Path, tmp_path: Path) -> None:
    verdicts = judge(suite, tmp_path,
                     claim("bytes-true", "total_bytes", "ratio_le", 0.02),
                     claim("bytes-false", "total_bytes", "ratio_le", 0.005),
                     claim("accuracy-borderline", "final_accuracy", "diff_ge", 0.0),
                     claim("accuracy-within", "final_accuracy", "diff_ge", -0.03),
                     claim("faster", "time_to_target_s", "ratio_le", 0.7),
                     claim("twice-as-fast", "time_to_target_s", "ratio_le", 0.4))
    assert verdicts.loc["bytes-true", "verdict"] == "PASS"
    assert verdicts.loc["bytes-true", ["estimate", "ci_low", "ci_high"]].tolist() == pytest.approx([0.01] * 3)
    assert verdicts.loc["bytes-false", "verdict"] == "FAIL"
    assert verdicts.loc["accuracy-borderline", "verdict"] == "INCONCLUSIVE"  # the interval holds 0
    low, high = verdicts.loc["accuracy-borderline", ["ci_low", "ci_high"]]
    assert low < 0 < high
    # differences +0.01, -0.01, 0: the t interval is 0 -+ 4.30 * 0.01 / sqrt(3) = [-0.0248, 0.0248] (the bootstrap's
    # min-max [-0.01, 0.01] claimed more than 3 seeds say)
    assert (low, high) == pytest.approx((-0.024841, 0.024841), abs=1e-6)
    assert verdicts.loc["accuracy-within", "verdict"] == "PASS"
    assert verdicts.loc["faster", "verdict"] == "PASS" and verdicts.loc["twice-as-fast", "verdict"] == "FAIL"
    assert (verdicts["pairs"] == 3).all()


def test_the_verdict_rule():
    assert verdict("ratio_le", 1.0, 0.5, 0.9) == "PASS"
    assert verdict("ratio_le", 1.0, 1.1, 1.2) == "FAIL"
    assert verdict("ratio_le", 1.0, 0.9, 1.1) == "INCONCLUSIVE"
    assert verdict("diff_ge", 0.0, 0.0, 0.1) == "PASS"
    assert verdict("diff_ge", 0.0, float("nan"), 0.1) == "INCONCLUSIVE"


def test_fewer_than_three_seeds_are_inconclusive(suite: Path, tmp_path: Path) -> None:
    verdicts = judge(suite, tmp_path, claim("sgd", "final_accuracy", "diff_ge", -0.5, method="sgd x1"))
    assert verdicts.loc["sgd", "verdict"] == "INCONCLUSIVE" and verdicts.loc["sgd", "pairs"] == 2
    assert "3 needed" in verdicts.loc["sgd", "note"]


def test_a_time_claim_on_noisy_runs_is_at_best_inconclusive(tmp_path: Path) -> None:
    suite_dir = tmp_path / "noisy"
    for seed in range(3):
        write_run(suite_dir, "ddp", seed, 0.93, 10.0, 1000, noisy=seed == 1)
        write_run(suite_dir, "dgc", seed, 0.93, 5.0, 10)
    table = tables.summary(load_suite(suite_dir))
    assert table["noisy"].tolist().count(True) == 1
    assert table["cpu_share"].min() == pytest.approx(1 / 3)
    path = claim_file(tmp_path / "c.toml", claim("time", "time_to_target_s", "ratio_le", 0.7),
                      claim("bytes", "total_bytes", "ratio_le", 0.02))
    verdicts = evaluate_claims(table, load_claims(path), path).set_index("id")
    assert verdicts.loc["time", "verdict"] == "INCONCLUSIVE" and "would be PASS" in verdicts.loc["time", "note"]
    assert verdicts.loc["bytes", "verdict"] == "PASS"  # bytes do not depend on the machine's load
    page = build.write_report(suite_dir).read_text()
    assert "Noisy measurements." in page and "1 of 6 runs were starved of CPU" in page
    assert "Noisy: ddp x2 (seed 1)" in page and "ddp_x2-s1" not in page.split("Noisy measurements.")[1][:600]


def test_method_and_baseline_name_labels_or_methods(suite: Path, tmp_path: Path) -> None:
    verdicts = judge(suite, tmp_path, claim("by-label", "total_bytes", "ratio_le", 0.02, "dgc x2", "ddp x2"))
    assert verdicts.loc["by-label", "verdict"] == "PASS"
    write_run(suite, "dgc", 0, 0.9, 5.0, 10, label="dgc density=0.01 x2")
    table = tables.summary(load_suite(suite))
    path = claim_file(tmp_path / "c.toml", claim("ambiguous", "total_bytes", "ratio_le", 0.02))
    with pytest.raises(FileError, match=r"c.toml: claim\[0\].method: method 'dgc' has several labels"):
        evaluate_claims(table, load_claims(path), path)


def test_labels_at_several_networks_pair_by_network(tmp_path: Path) -> None:
    suite_dir = tmp_path / "net"
    for seed in range(3):
        for rate, speed in (("1gbit", 1.0), ("100mbit", 0.2)):
            net = {"rate": rate, "latency": None}
            write_run(suite_dir, "ddp", seed, 0.93, 10.0, 1000, label=f"ddp x2 @ {rate}", network=net)
            write_run(suite_dir, "dgc", seed, 0.93, 10.0 * speed, 10, label=f"dgc x2 @ {rate}", network=net)
    table = tables.summary(load_suite(suite_dir))
    path = claim_file(tmp_path / "c.toml", claim("t", "time_to_target_s", "ratio_le", 1.0, "dgc x2", "ddp x2"))
    verdicts = evaluate_claims(table, load_claims(path), path)
    # the geometric mean of the per-pair ratios: three at 10 / 10, three at 2 / 10
    assert verdicts.loc[0, "pairs"] == 6 and verdicts.loc[0, "estimate"] == pytest.approx(0.2 ** 0.5)


def one(*claims: str) -> str:
    """A claim file's text with these [[claim]] tables."""
    return "".join(f"[[claim]]\n{c}" for c in claims)


@pytest.mark.parametrize(("text", "message"), [
    (one(claim("a", "total_bytes", "ratio_below", 1)), r"claim\[0\].relation"),
    (one(claim("a", "loss", "ratio_le", 1)), r"claim\[0\].metric: .*not a numeric summary.csv column"),
    (one(claim("a", "label", "ratio_le", 1)), r"claim\[0\].metric"),
    (one(claim("a", "total_bytes", "ratio_le", 1) + 'colour = "red"\n'), r"claim\[0\].colour: unknown key"),
    (one(claim("a", "total_bytes", "ratio_le", 1).replace('setting = "scaled-down"\n', "")),
     r"claim\[0\].setting: required key is missing"),
    (one(claim("a", "total_bytes", "ratio_le", 1), claim("a", "total_bytes", "ratio_le", 2)),
     r"claim\[1\].id: 'a' is also the id of claim\[0\]"),
    (one(claim("a", "total_bytes", "ratio_le", 1, method="nope")), r"claim\[0\].method: no run has the label"),
    (one(claim("a", "total_bytes", "ratio_le", 1, baseline="nope")), r"claim\[0\].baseline: no run has"),
    ('suite = "other"\n' + one(claim("a", "total_bytes", "ratio_le", 1)), r": suite: the claims are about"),
    ("[[claim]\n", "not valid TOML"),
    ("", r": claim: required key is missing"),
])
def test_bad_claim_files_exit_2_with_one_line_and_write_nothing(suite: Path, tmp_path: Path, capsys, text,
                                                                message) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["claims", str(suite), str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dtbench: error: {path}") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not (suite / "report").exists()


def test_a_missing_claim_file_or_results_folder_exits_2(suite: Path, tmp_path: Path, capsys) -> None:
    assert main(["claims", str(suite), str(tmp_path / "missing.toml")]) == 2
    assert "cannot read claim file" in capsys.readouterr().err
    path = claim_file(tmp_path / "c.toml", claim("a", "total_bytes", "ratio_le", 1))
    assert main(["claims", str(tmp_path / "nowhere"), str(path)]) == 2


def test_the_cli_prints_writes_claims_csv_and_exits_1_on_a_fail(suite: Path, tmp_path: Path, capsys) -> None:
    passing = claim_file(tmp_path / "pass.toml", claim("bytes", "total_bytes", "ratio_le", 0.02), suite="fake")
    assert main(["claims", str(suite), str(passing)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "bytes holds" in out and "1 PASS, 0 FAIL, 0 INCONCLUSIVE" in out
    with (suite / "report" / "claims.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(CLAIM_COLUMNS) and list(rows[0])[:6] == [
        "id", "statement", "estimate", "ci_low", "ci_high", "verdict"]
    assert rows[0]["verdict"] == "PASS" and float(rows[0]["estimate"]) == pytest.approx(0.01)
    failing = claim_file(tmp_path / "fail.toml", claim("bytes", "total_bytes", "ratio_le", 0.001),
                         claim("acc", "final_accuracy", "diff_ge", 0.0))
    assert main(["claims", str(suite), str(failing), "--out", str(tmp_path / "elsewhere")]) == 1
    assert "FAIL" in capsys.readouterr().out and (tmp_path / "elsewhere" / "claims.csv").exists()


def test_the_report_shows_claims_beside_the_suite_file(suite: Path, tmp_path: Path) -> None:
    from harness.claims.section import claim_file_for, claims_page_section

    def write_report(folder):  # as `dtbench report` does
        return build.write_report(folder, extra_sections=[claims_page_section])

    page = write_report(suite).read_text()
    assert "<h2>Claims</h2>" not in page and claim_file_for(suite, load_suite(suite)) is None
    inside = claim_file(suite / "fake.claims.toml", claim("bytes", "total_bytes", "ratio_le", 0.02))
    assert claim_file_for(suite, load_suite(suite)) == inside  # in the results folder, as a fallback
    beside = claim_file(suite.parent / "fake.claims.toml", claim("bytes", "total_bytes", "ratio_le", 0.02))
    assert claim_file_for(suite, load_suite(suite)) == beside  # beside the suite file fake.toml: first
    page = write_report(suite).read_text()
    assert "<h2>Claims</h2>" in page and '<td class="PASS">PASS</td>' in page
    assert (suite / "report" / "claims.csv").exists()
    beside.write_text("[[claim]]\nid = 1\n")
    page = write_report(suite).read_text()
    assert "The claim file could not be judged" in page and "claim[0].id" in page


@pytest.mark.parametrize("claims_path", sorted((ROOT / "suites").glob("*.claims.toml")), ids=lambda p: p.name)
def test_every_shipped_claim_file_loads_and_names_runs_of_its_suite(claims_path: Path) -> None:
    from harness.claims.evaluate import matching_rows
    from harness.suite.expand import expand_suite

    claims = load_claims(claims_path)
    suite = claims_path.with_name(claims_path.name.replace(".claims.toml", ".toml"))
    if not suite.exists():
        pytest.skip(f"no suite file beside {claims_path.name}")
    specs = expand_suite(suite, None, None)
    table = pd.DataFrame({"label": [s.label for s in specs], "method": [s.method for s in specs],
                          "network": [""] * len(specs)})
    for claim in claims.claim:
        for name in (claim.method, claim.baseline):
            assert matching_rows(table, name).any(), f"{claim.id}: {name!r} names no run of {suite.name}"


def test_a_design_check_and_a_cluster_claim_are_shown_apart_from_the_evidence(suite: Path, tmp_path: Path,
                                                                               capsys) -> None:
    design = claim("layout", "total_bytes", "ratio_le", 0.02) + 'kind = "design"\nwhy = "the payload layout"\n'
    cluster = (claim("speed", "time_to_target_s", "ratio_le", 0.7) + 'kind = "cluster"\n'
               'why = "2 cores cannot show it"\n')
    path = claim_file(tmp_path / "c.toml", claim("acc", "final_accuracy", "diff_ge", -0.02), design, cluster)
    assert main(["claims", str(suite), str(path)]) == 0
    out = capsys.readouterr().out
    evidence, rest = out.split("Design checks")
    assert "acc holds" in evidence and "layout holds" not in evidence and "speed holds" not in evidence
    assert "layout holds" in rest.split("Needs a cluster")[0] and "speed holds" in rest.split("Needs a cluster")[1]
    assert "1 PASS, 0 FAIL, 0 INCONCLUSIVE" in out and "design checks: 1 PASS, 0 FAIL, 0 INCONCLUSIVE" in out
    verdicts = pd.read_csv(suite / "report" / "claims.csv").set_index("id")
    assert verdicts.loc["layout", "kind"] == "design" and verdicts.loc["layout", "verdict"] == "PASS"
    # the speed claim's interval passes, but this machine cannot decide it: never PASS, and the note says why
    assert verdicts.loc["speed", "verdict"] == "INCONCLUSIVE"
    assert "would be PASS here, but needs a cluster: 2 cores cannot show it" in verdicts.loc["speed", "note"]
    html_text = display.claims_html(verdicts.reset_index().fillna({"note": ""}), path)
    assert html_text.index("acc") < html_text.index('id="claims-design"') < html_text.index("layout")
    assert html_text.index("layout") < html_text.index('id="claims-cluster"') < html_text.index("speed holds")


def test_a_design_or_cluster_claim_without_why_and_a_negative_tolerance_are_errors(suite: Path, tmp_path: Path,
                                                                                  capsys) -> None:
    for extra, message in (('kind = "design"\n', "why: required for kind = 'design'"),
                           ('kind = "proof"\n', r"claim\[0\].kind")):
        path = claim_file(tmp_path / "c.toml", claim("a", "total_bytes", "ratio_le", 1) + extra)
        assert main(["claims", str(suite), str(path)]) == 2
        assert re.search(message, capsys.readouterr().err)
    path = claim_file(tmp_path / "c.toml", claim("a", "final_accuracy", "absdiff_le", -0.1))
    assert main(["claims", str(suite), str(path)]) == 2
    assert "absdiff_le needs a tolerance >= 0" in capsys.readouterr().err


def test_absdiff_le_fails_a_method_below_the_baseline_by_more_than_the_tolerance(suite: Path, tmp_path: Path) -> None:
    # dgc's accuracy is ddp's +0.01, -0.01, 0: its mean difference is 0 (as transparent as can be) ...
    verdicts = judge(suite, tmp_path, claim("same", "final_accuracy", "absdiff_le", 0.03),
                     claim("bytes-same", "total_bytes", "absdiff_le", 1.0))
    assert verdicts.loc["same", "verdict"] == "PASS"
    # ... while its bytes are far *below* ddp's: one-sided diff_le would pass them, |diff| <= 1 does not
    assert verdicts.loc["bytes-same", "verdict"] == "FAIL"


def test_requires_is_followed_to_the_end_of_a_chain(suite: Path, tmp_path: Path) -> None:
    # a requires b requires c: c undecided demotes b, and so a, though a is listed before b and read first
    a = claim("a", "total_bytes", "ratio_le", 0.02) + 'requires = ["b"]\n'
    b = claim("b", "total_bytes", "ratio_le", 0.03) + 'requires = ["c"]\n'
    c = claim("c", "final_accuracy", "diff_ge", 0.0)  # the interval holds 0: INCONCLUSIVE
    verdicts = judge(suite, tmp_path, a, b, c)
    assert verdicts["verdict"].tolist() == ["INCONCLUSIVE"] * 3
    assert "control did not pass (b is INCONCLUSIVE)" in verdicts.loc["a", "note"]
    assert "control did not pass (c is INCONCLUSIVE)" in verdicts.loc["b", "note"]
    c_passes = claim("c", "final_accuracy", "diff_ge", -0.1)
    assert judge(suite, tmp_path, a, b, c_passes)["verdict"].tolist() == ["PASS"] * 3


def test_a_pass_counts_only_when_its_control_passes(suite: Path, tmp_path: Path, capsys) -> None:
    control_fails = claim("control", "total_bytes", "ratio_le", 0.001)  # 0.01: FAIL
    guarded = claim("guarded", "total_bytes", "ratio_le", 0.02) + 'requires = ["control"]\n'  # PASS alone
    verdicts = judge(suite, tmp_path, control_fails, guarded)
    assert verdicts.loc["guarded", "verdict"] == "INCONCLUSIVE"
    assert "would be PASS, but its control did not pass (control is FAIL)" in verdicts.loc["guarded", "note"]
    control_passes = claim("control", "total_bytes", "ratio_le", 0.05)
    assert judge(suite, tmp_path, control_passes, guarded).loc["guarded", "verdict"] == "PASS"
    path = claim_file(tmp_path / "bad.toml", claim("a", "total_bytes", "ratio_le", 1) + 'requires = ["nope"]\n')
    assert main(["claims", str(suite), str(path)]) == 2
    assert "claim[0].requires: 'nope' is not the id of another claim" in capsys.readouterr().err
