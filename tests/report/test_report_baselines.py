"""A baseline per workload: the suite's for that workload, else its first ddp run whatever its label, else its first
label; --baseline where it ran; none (and no winner named) where one label ran."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from test_report_lm import write_lm_run

from harness.report import build
from harness.report.baselines import Baseline, workload_baselines
from harness.results import RunResult


def table(*rows: tuple[str, str, str]) -> pd.DataFrame:
    """(workload, method, label) rows -> a summary-like table."""
    return pd.DataFrame([{"workload": w, "method": m, "label": label, "network": ""} for w, m, label in rows])


def test_the_rules_in_order() -> None:
    runs = table(("a", "sgd", "sgd x1"), ("a", "ddp", "ddp adamw x2"), ("a", "ddp", "ddp x2"),
                 ("b", "gpipe", "gpipe x2"), ("b", "1f1b", "1f1b x2"),
                 ("c", "apapo", "apapo x2"),
                 ("d", "sgd", "sgd x1"), ("d", "ddp", "ddp x2"))
    chosen = workload_baselines(runs)
    assert chosen["a"] == Baseline("ddp adamw x2", "default: the first ddp run")  # the first ddp, whatever its label
    assert chosen["b"].label == "gpipe x2" and "no ddp run" in chosen["b"].how
    assert chosen["c"].label is None and "nothing to compare" in chosen["c"].how
    assert workload_baselines(runs, requested="sgd x1")["a"] == Baseline("sgd x1", "--baseline")
    assert workload_baselines(runs, requested="sgd x1")["b"].label == "gpipe x2"  # it did not run on b
    spec_runs = [RunResult(Path("r"), {"workload": "d", "baseline": "sgd"}, None, None, pd.DataFrame())]
    assert workload_baselines(runs, spec_runs)["d"] == Baseline("sgd x1", "the suite's baseline")  # a method name
    assert workload_baselines(runs, spec_runs)["a"].label == "ddp adamw x2"


def test_each_workload_is_ranked_against_its_own_ddp(tmp_path: Path) -> None:
    from test_report import write_run

    suite = tmp_path / "mix"
    for seed in range(3):
        write_run(suite, "ddp", "ddp x2", seed, "completed", [(1.0, 0.5), (2.0, 0.93), (3.0, 0.95)])
        write_run(suite, "sgd", "sgd x1", seed, "completed", [(1.0, 0.92), (1.5, 0.94), (2.0, 0.95)])
        write_lm_run(suite, "ddp", "ddp adamw lm", seed, [(2.0, 3.4), (4.0, 2.8), (6.0, 2.7)])
        write_lm_run(suite, "sgd", "sgd adamw lm", seed, [(1.0, 3.5), (2.0, 2.85), (3.0, 2.7)])
    page = build.write_report(suite).read_text(encoding="utf-8")
    assert "On digits-mlp, sgd x1 reached the target 0.9 fastest" in page and "the baseline ddp x2." in page
    assert "On shakespeare-gpt, sgd adamw lm reached the target loss 2.9 fastest" in page
    assert "the baseline ddp adamw lm." in page and "did not run here" not in page
    assert "speed-up vs ddp x2" in page and "speed-up vs ddp adamw lm" in page
    ranked = pd.read_csv(suite / "report" / "rankings.csv")
    assert dict(zip(ranked["workload"], ranked["baseline"], strict=False)) == {
        "digits-mlp": "ddp x2", "shakespeare-gpt": "ddp adamw lm"}
    assert "each workload&#x27;s own" in page or "each workload's own" in page
