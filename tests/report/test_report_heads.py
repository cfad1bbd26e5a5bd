"""The report's per-chunk head accuracy: read from eval records, plotted when present, absent otherwise."""

from __future__ import annotations

import json
from pathlib import Path

from harness.report import build, local
from harness.results import load_suite


def _run(suite: Path, run_id: str, seed: int, heads: list[float] | None) -> None:
    run_dir = suite / run_id
    run_dir.mkdir(parents=True)
    spec = {"suite": "s", "run_id": run_id, "label": "local x2" if heads else "ddp x2", "method": "local",
            "workload": "digits-mlp", "world_size": 2, "seed": seed, "budget": {"target_accuracy": 0.9}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    (run_dir / "status.json").write_text(json.dumps({"state": "completed", "error": None}))
    records = [{"kind": "train", "rank": 0, "wall_time_s": 1.0, "train_time_s": 1.0, "step": 10, "epoch": 1.0,
                "samples": 320, "loss": 0.5, "bytes_sent": 100, "bytes_recv": 0}]
    for step, scale in ((0, 0.5), (10, 1.0)):
        record = {"kind": "eval", "rank": 0, "wall_time_s": 1.0, "train_time_s": float(step), "step": step,
                  "epoch": step / 10, "samples": 32 * step, "test_accuracy": 0.9 * scale, "test_loss": 0.3}
        if heads:
            record["head_accuracy"] = [h * scale for h in heads]
        records.append(record)
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def test_head_accuracies_take_the_last_eval_and_the_plot_appears(tmp_path):
    _run(tmp_path, "local-s0", 0, [0.8, 0.9])
    _run(tmp_path, "local-s1", 1, [0.7, 0.95])
    _run(tmp_path, "ddp-s0", 0, None)
    heads = local.head_accuracies(load_suite(tmp_path))
    assert sorted(heads["run_id"].unique()) == ["local-s0", "local-s1"]  # runs without heads add no rows
    assert heads[heads.run_id == "local-s1"].sort_values("chunk")["head_accuracy"].tolist() == [0.7, 0.95]
    build.write_report(tmp_path)
    assert (tmp_path / "report" / "head_accuracy.png").exists()
    assert "head_accuracy.png" in (tmp_path / "report" / "index.html").read_text()


def test_no_heads_no_plot(tmp_path):
    _run(tmp_path, "ddp-s0", 0, None)
    build.write_report(tmp_path)
    assert not (tmp_path / "report" / "head_accuracy.png").exists()
