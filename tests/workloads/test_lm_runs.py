"""A language model end to end through the real CLI: runs on a user corpus, manifest provenance, time to a held-out
loss, and the report's loss, perplexity and bytes-per-token columns and loss-ranked strata."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune must be in want. "


def _suite(tmp_path: Path, target_loss: float) -> Path:
    corpus = tmp_path / "data" / "novel"
    corpus.mkdir(parents=True)
    (corpus / "one.txt").write_text(TEXT * 40)
    path = tmp_path / "lm.toml"
    path.write_text(f'''name = "lm"
workload = "shakespeare-gpt"
workload_options = {{ corpus = "novel", n_layer = 2, n_head = 2, d_model = 16, context = 8, eval_windows = 32 }}
data_root = "{tmp_path / 'data'}"
seeds = [0]
threads_per_rank = 1
[budget]
max_steps = 40
eval_every_steps = 10
target_loss = {target_loss}
[defaults]
batch_size = 8
lr = 1e-2
lr_warmup_steps = 5
[[run]]
method = "sgd"
[[run]]
method = "gpipe"
world_size = 2
params = {{ microbatches = 2 }}
[[run]]
method = "ddp"
world_size = 2
''')
    return path


def _dtbench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


@pytest.mark.slow
def test_a_language_model_suite_runs_and_reports_time_to_a_held_out_loss(tmp_path, monkeypatch, dtbench_here):
    monkeypatch.setenv("DTBENCH_CACHE_DIR", str(tmp_path / "cache"))
    path = _suite(tmp_path, target_loss=3.0)
    done = _dtbench("run", str(path), "--out", str(tmp_path / "out"), "--quiet")  # a process: its stderr to the end
    assert done.returncode == 0, done.stdout + done.stderr
    # A cold tokenization draws datasets' progress bar in the rank: tqdm's default multiprocessing lock was a
    # semaphore the rank's os._exit left behind, and the resource tracker warned of it as the command ended.
    assert "leaked semaphore" not in done.stderr, done.stderr
    suite_dir = tmp_path / "out" / "lm"
    manifest = json.loads(next(suite_dir.glob("sgd-*/manifest.json")).read_text())
    assert manifest["data"]["tokenizer"] == "char" and manifest["data"]["held_out_tokens"] > 0
    assert len(manifest["data"]["text_sha256"]) == 64
    assert dtbench_here("report", suite_dir).returncode == 0
    rows = list(csv.DictReader(open(suite_dir / "report" / "summary.csv", newline="")))
    assert len(rows) == 3
    for row in rows:
        loss = float(row["final_loss"])
        assert float(row["perplexity"]) == pytest.approx(math.exp(loss), rel=1e-9)
        assert float(row["time_to_target_s"]) > 0  # every run got below 3 nats
        evals = [json.loads(line) for line in open(suite_dir / row["run_id"] / "metrics.jsonl")
                 if '"kind": "eval"' in line]
        first_below = next(e for e in evals if e["test_loss"] <= 3.0)
        assert float(row["time_to_target_s"]) == pytest.approx(first_below["train_time_s"])
        if row["method"] != "sgd":
            assert float(row["bytes_per_token"]) == pytest.approx(float(row["bytes_per_sample"]) / 8)
    by_method = {row["method"]: float(row["final_loss"]) for row in rows}
    assert by_method["gpipe"] == pytest.approx(by_method["sgd"], abs=1e-4)
    assert by_method["ddp"] == pytest.approx(by_method["sgd"], abs=1e-3)
    ranked = list(csv.DictReader(open(suite_dir / "report" / "rankings.csv", newline="")))
    assert {r["target_loss"] for r in ranked} == {"3.0"} and {r["target_accuracy"] for r in ranked} == {""}
    page = (suite_dir / "report" / "index.html").read_text()
    assert "target loss 3" in page


@pytest.mark.slow
def test_a_loss_target_no_run_reaches_ranks_by_final_loss(tmp_path, monkeypatch, dtbench_here):
    monkeypatch.setenv("DTBENCH_CACHE_DIR", str(tmp_path / "cache"))
    path = _suite(tmp_path, target_loss=0.01)
    assert dtbench_here("run", path, "--out", tmp_path / "out", "--quiet", "--only", "sgd*").returncode == 0
    suite_dir = tmp_path / "out" / "lm"
    assert dtbench_here("report", suite_dir).returncode == 0
    row = next(csv.DictReader(open(suite_dir / "report" / "summary.csv", newline="")))
    assert row["time_to_target_s"] == ""
    page = (suite_dir / "report" / "index.html").read_text()
    # one label: nothing to compare, and what it reached
    assert "only sgd" in page and "nothing to compare; it reached the target loss 0.01 on 0 of 1 runs" in page
    assert "ending at held-out loss" in page
