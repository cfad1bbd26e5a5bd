"""suites/cifar10.toml: the standard ResNet-20 recipe, run end to end with its step schedule on a tiny CIFAR-format
folder written by the test (the real data cannot be downloaded here)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.data import cifar10
from harness.results import read_jsonl
from harness.suite.expand import expand_suite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NUM_TRAIN, NUM_TEST, BATCH = 64, 32, 16  # 4 steps per epoch


def test_the_cifar10_suite_is_the_standard_recipe(repo_root: Path) -> None:
    specs = expand_suite(repo_root / "suites" / "cifar10.toml")
    assert {s.method for s in specs} == {"sgd", "ddp", "qsgd", "terngrad", "dgc"} and len(specs) == 15
    for spec in specs:
        p = spec.params
        assert (p.batch_size, p.lr, p.momentum, p.weight_decay) == (128, 0.1, 0.9, 1e-4)
        assert (p.lr_schedule, p.milestones, p.gamma) == ("step", [0.5, 0.75], 0.1)
        assert spec.budget.max_epochs == 160 and spec.budget.target_accuracy == 0.91
    assert (repo_root / "suites" / "cifar10.claims.toml").is_file()


@pytest.mark.slow
def test_cifar10_with_the_step_schedule_runs_end_to_end(repo_root: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    cifar10.write_torchvision_format(
        tmp_path / "data", rng.integers(0, 256, (NUM_TRAIN, 3, 32, 32), dtype=np.uint8),
        rng.integers(0, 10, NUM_TRAIN), rng.integers(0, 256, (NUM_TEST, 3, 32, 32), dtype=np.uint8),
        rng.integers(0, 10, NUM_TEST))
    recipe = tomllib.loads((repo_root / "suites" / "cifar10.toml").read_text())["defaults"]
    defaults = {**recipe, "batch_size": BATCH}  # the recipe, on a batch the 64 images can fill
    lines = [f"{key} = {value!r}".replace("'", '"') for key, value in defaults.items()]
    suite = tmp_path / "cifar10-tiny.toml"
    suite.write_text(f'name = "cifar10-tiny"\nworkload = "cifar10-resnet20"\nseeds = [0]\nthreads_per_rank = 1\n'
                     f'data_root = "{tmp_path / "data"}"\n[budget]\nmax_epochs = 4\neval_every_epochs = 2\n'
                     f"target_accuracy = 0.91\n[defaults]\n" + "\n".join(lines) + "\n"
                     '[[run]]\nmethod = "sgd"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n')
    out = tmp_path / "results"
    assert main(["run", str(suite), "--out", str(out), "--quiet"]) == 0
    wanted = [0.1] * 8 + [0.01] * 4 + [0.001] * 4  # 16 steps: /10 after 8 (50%) and after 12 (75%)
    for run_id, ranks in (("sgd-cifar10-resnet20-w1-s0", 1), ("ddp-cifar10-resnet20-w2-s0", 2)):
        records = read_jsonl(out / "cifar10-tiny" / run_id / "metrics.jsonl")
        for rank in range(ranks):
            lrs = [r["lr"] for r in records if r["kind"] == "train" and r["rank"] == rank]
            assert lrs == pytest.approx(wanted, rel=1e-12), (run_id, rank)
        assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 8, 16]
        assert sum(r["kind"] == "cpu" for r in records) == ranks
    assert main(["report", str(out / "cifar10-tiny")]) == 0
    assert (out / "cifar10-tiny" / "report" / "index.html").stat().st_size > 0
