"""Divergence is caught where it happens: in every pipeline, synchronous or not, the run stops within a few steps of
the first non-finite loss any rank computes, and its message names that step."""

from __future__ import annotations

import json
import math

from test_launcher import suite

from harness.results import read_jsonl

# lr 40 blows digits-mlp up within tens of steps (the loss passes 1e20 before it turns to inf or NaN); qfb's 2-Step
# gradient compression keeps its loss finite (about 1e7, at chance) at lr 40, so it gets a larger one.
RUNS = [
    ("gpipe", "microbatches = 4, lr = 40.0"),
    ("1f1b", "microbatches = 4, lr = 40.0"),
    ("pipedream", "lr = 40.0"),
    ("pb", 'compensation = "none", prediction = "none", lr = 40.0'),
    ("qfb", "microbatches = 4, lr = 1e6"),
    ("qfb", 'microbatches = 4, sync = "ahead", lr = 1e6'),
    ("apapo", "microbatches = 4, replicate = false, lr = 40.0"),
]
#: the runner's bound: the control round runs at least every 8 steps and is acted on one round later (2·8 - 1)
WITHIN = 15


def test_every_pipeline_stops_within_a_few_steps_of_its_first_non_finite_loss(tmp_path, dtbench_here):
    body = "".join(f'[[run]]\nmethod = "{m}"\nworld_size = 2\nparams = {{ {p} }}\n' for m, p in RUNS)
    proc = dtbench_here("run", str(suite(tmp_path, "blowup", body, epochs=5)), "--out", str(tmp_path / "o"), "--quiet")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    seen = []
    for run_dir in sorted((tmp_path / "o" / "blowup").glob("*-digits-mlp-*")):
        status = json.loads((run_dir / "status.json").read_text())
        method = json.loads((run_dir / "spec.json").read_text())["method"]
        seen.append(method)
        assert status["state"] == "diverged", (method, status)
        losses = [(r["step"], float(r["loss"])) for r in read_jsonl(run_dir / "metrics.jsonl")
                  if r["kind"] == "train" and r["loss"] is not None]
        first = min(step for step, loss in losses if not math.isfinite(loss))
        assert f"non-finite loss at step {first} " in status["error"]["message"], (method, first, status)
        assert first <= status["final"]["steps"] <= first + WITHIN, (method, first, status["final"])
    assert sorted(seen) == sorted(m for m, _ in RUNS)
