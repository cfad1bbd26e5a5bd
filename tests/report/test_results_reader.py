"""Tests of harness/results.py: tolerant JSON-lines reading and loading run and suite folders."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from harness.results import BASE_COLUMNS, load_run, load_suite, read_json, read_jsonl

TRAIN = {"kind": "train", "rank": 0, "wall_time_s": 0.5, "train_time_s": 0.4, "step": 10, "epoch": 0.23,
         "samples": 320, "loss": 1.2, "bytes_sent": 123456, "bytes_recv": 123456,
         "bytes_by_category": {"gradients": [123456, 123456]}}
TRAIN_1 = {**TRAIN, "rank": 1, "bytes_sent": 654321}
EVAL = {"kind": "eval", "rank": 0, "wall_time_s": 0.6, "train_time_s": 0.4, "step": 44, "epoch": 1.0,
        "samples": 1408, "test_accuracy": 0.9, "test_loss": 0.3}
TRACE = {"kind": "trace", "rank": 1, "wall_time_s": 0.7, "train_time_s": 0.5, "events": [["fwd", 0]]}
SPEC = {"suite": "smoke", "run_id": "ddp-digits-mlp-w2-s0", "label": "ddp x2", "method": "ddp", "seed": 0,
        "world_size": 2, "budget": {"target_accuracy": 0.95}}


def lines(*records: dict) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def make_run(parent: Path, name: str, spec: dict | None = None, status: dict | None = None,
             metrics: str | None = None) -> Path:
    run_dir = parent / name
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps({**SPEC, "run_id": name} if spec is None else spec))
    if status is not None:
        (run_dir / "status.json").write_text(json.dumps(status))
    if metrics is not None:
        (run_dir / "metrics.jsonl").write_text(metrics)
    return run_dir


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(TRAIN, TRAIN_1, EVAL) + '{"kind": "train", "rank": 1, "wall_ti')
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:4: skipped a corrupt line") as caught:
        records = read_jsonl(path)
    assert records == [TRAIN, TRAIN_1, EVAL]
    assert len([w for w in caught if "corrupt" in str(w.message)]) == 1
    assert str(path) in str(caught[0].message)


def test_every_bad_line_warns_once_and_the_rest_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(TRAIN) + "not json\n" + "[1, 2]\n" + "\n" + lines(EVAL) + '{"kind": "ev\xe9')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_jsonl(path)
    assert records == [TRAIN, EVAL]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3  # the blank line is not a warning
    assert [m.split(": skipped")[0] for m in messages] == [f"{path}:2", f"{path}:3", f"{path}:6"]
    assert "not an object" in messages[1]


def test_missing_files(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_jsonl(tmp_path / "nope.jsonl") == []
        assert read_json(tmp_path / "nope.json") is None


def test_read_json_corrupt_warns_and_gives_none(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text('{"state": "completed"}')
    (tmp_path / "bad.json").write_text('{"state": "compl')
    (tmp_path / "list.json").write_text("[1]")
    assert read_json(tmp_path / "ok.json") == {"state": "completed"}
    with pytest.warns(UserWarning, match=r"bad\.json: ignored a corrupt JSON file"):
        assert read_json(tmp_path / "bad.json") is None
    with pytest.warns(UserWarning, match=r"list\.json: .*not an object"):
        assert read_json(tmp_path / "list.json") is None


def test_load_run_reads_everything_and_keeps_unknown_kinds(tmp_path: Path) -> None:
    status = {"state": "failed", "error": {"message": "rank 1 was killed by signal SIGKILL", "rank": 1}}
    metrics = lines(TRAIN, TRAIN_1, EVAL, TRACE)
    run_dir = make_run(tmp_path, "ddp-digits-mlp-w2-s0", status=status, metrics=metrics)
    (run_dir / "manifest.json").write_text(json.dumps({"git_commit": "abc"}))
    run = load_run(run_dir)
    assert run.run_dir == run_dir and run.spec["run_id"] == "ddp-digits-mlp-w2-s0"
    assert run.status == status and run.manifest == {"git_commit": "abc"}
    assert (run.state, run.label) == ("failed", "ddp x2")
    metrics = run.metrics
    assert list(metrics["kind"]) == ["train", "train", "eval", "trace"]
    assert set(TRAIN) | set(EVAL) | set(TRACE) == set(metrics.columns)  # the union of the keys
    assert list(metrics["bytes_sent"].iloc[:2]) == [123456, 654321]
    assert metrics["test_accuracy"].iloc[:2].isna().all() and metrics["test_accuracy"].iloc[2] == 0.9


def test_load_run_without_metrics_status_or_label(tmp_path: Path) -> None:
    spec = {key: value for key, value in SPEC.items() if key != "label"}
    run = load_run(make_run(tmp_path, "r", spec=spec))
    assert run.status is None and run.manifest is None
    assert (run.state, run.label) == ("unknown", "ddp")
    assert run.metrics.empty and set(BASE_COLUMNS) <= set(run.metrics.columns)
    with pytest.raises(ValueError, match="spec.json is missing or corrupt"):
        load_run(tmp_path / "missing")


def test_load_suite_sorted_skipping_report_and_non_runs(tmp_path: Path) -> None:
    suite = tmp_path / "smoke"
    for name in ("qsgd-s1", "ddp-s1", "ddp-s0"):
        make_run(suite, name, status={"state": "completed"}, metrics=lines(TRAIN, EVAL))
    make_run(suite, "report")  # even with a spec.json, report/ is not a run
    (suite / "logs-only").mkdir()
    (suite / "suite.toml").write_text('name = "smoke"\n')
    runs = load_suite(suite)
    assert [run.run_dir.name for run in runs] == ["ddp-s0", "ddp-s1", "qsgd-s1"]
    assert all(len(run.metrics) == 2 for run in runs)
    assert load_suite(tmp_path / "nothing-here") == []
