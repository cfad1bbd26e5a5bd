"""Emulated device memory: the byte counts, the saved-tensor counter, profiled plans against measured bytes, and the
refusal of a run whose plan exceeds memory_per_rank before its first step."""

from __future__ import annotations

import gc
import json

import pandas as pd
import pytest
import torch
from torch import nn

from harness import registry
from harness.bytesize import format_bytes, memory_text, parse_bytes
from harness.memory import (
    LossBlock,
    MemoryBytes,
    SavedTensors,
    chain_saved_bytes,
    footprints,
    planned_optimizer_bytes,
    refusal,
    storages,
)
from harness.suite.expand import expand_suite
from harness.suite.files import FileError


def test_byte_counts_read_and_written():
    assert parse_bytes("48MB") == 48_000_000
    assert parse_bytes("1.5 GiB") == 3 * 2**29
    assert parse_bytes(4096) == 4096
    for bad in ("fast", "12 parsecs", "-3MB", 0, True, "0MB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    assert format_bytes(61_234_567) == "61.2 MB" and format_bytes(999) == "999 B"
    assert memory_text(48_000_000) == "48MB" and memory_text(2**26) == "64MiB" and memory_text(1001) == "1001"


def test_saved_tensors_counts_each_storage_once_and_releases_it_with_its_graph():
    layer = nn.Linear(100, 100)
    x = torch.randn(8, 100)
    counter = SavedTensors(storages([layer]))
    with counter:
        h = torch.relu(layer(x))  # linear keeps x (its weight is excluded), relu keeps its output
        y = (h * h).sum()  # mul keeps h twice: one storage
    assert counter.live == counter.peak == 2 * 8 * 100 * 4
    y.backward()
    del y, h
    gc.collect()
    assert counter.live == 0 and counter.peak == 2 * 8 * 100 * 4


def test_a_microbatch_view_counts_its_own_elements_not_its_minibatch():
    layer = nn.Linear(10, 10)
    batch = torch.randn(64, 10)
    counter = SavedTensors(storages([layer]))
    with counter:
        layer(batch[:16]).sum()
    assert counter.peak == 16 * 10 * 4


@pytest.mark.parametrize("workload", ["digits-mlp", "digits-resnet", "shakespeare-gpt"])
def test_a_profiled_chain_plans_exactly_what_a_training_step_saves(workload):
    instance = registry.WORKLOADS.get(workload).instantiate({}, None)
    torch.manual_seed(0)
    model = instance.make_model()
    index = torch.arange(8)
    x, y = instance.train.inputs(index), instance.train.targets(index)
    prints = footprints([*model, LossBlock(instance.loss, y)], x)
    counter = SavedTensors(storages([model]))
    with counter:
        loss = instance.loss(model(x), y)
    assert chain_saved_bytes(prints, 0, len(prints)) == counter.peak > 0
    loss.backward()


def test_a_stage_of_the_chain_plans_what_it_saves_from_a_detached_input():
    model = nn.Sequential(nn.Sequential(nn.Linear(16, 32), nn.ReLU()), nn.Sequential(nn.Linear(32, 32), nn.ReLU()),
                          nn.Linear(32, 4))
    x = torch.randn(8, 16)
    prints = footprints(list(model), x, detach_inputs=True)
    h = model[0](x).detach().requires_grad_(True)
    counter = SavedTensors(storages([model]))
    with counter:
        model[2](model[1](h))
    assert chain_saved_bytes(prints, 1, 3) == counter.peak


def test_planned_optimizer_state():
    weights = [nn.Parameter(torch.zeros(10, 10)), nn.Parameter(torch.zeros(10))]
    assert planned_optimizer_bytes(torch.optim.SGD(weights, lr=0.1)) == 0
    assert planned_optimizer_bytes(torch.optim.SGD(weights, lr=0.1, momentum=0.9)) == 440
    assert planned_optimizer_bytes(torch.optim.AdamW(weights)) == 2 * 440 + 2 * 4


def test_the_refusal_names_the_rank_that_needs_most_and_the_budget():
    plans = {0: MemoryBytes(weights=10, activations=5), 1: MemoryBytes(weights=30, optimizer=30)}
    assert refusal(plans, 60) is None
    line = refusal(plans, 59)
    assert line == "does not fit: rank 1 needs 60 B > memory_per_rank 59 B (weights 30 B, optimizer 30 B)"


SUITE = """name = "fit"
workload = "digits-mlp"
seeds = [0]
threads_per_rank = 1
{memory}
[budget]
max_steps = 6
eval_every_steps = 3
[defaults]
batch_size = 32
lr = 0.05
momentum = 0.9
[[run]]
method = "ddp"
world_size = 2
[[run]]
method = "gpipe"
world_size = 3
params = {{ microbatches = 4 }}
"""


@pytest.mark.parametrize("value, message", [
    ('"48 parsecs"', "memory_per_rank: expected bytes"),
    ("-5", "memory_per_rank: must be positive"),
    ("true", "memory_per_rank"),
])
def test_a_bad_memory_per_rank_names_the_file_and_field(tmp_path, value, message, dtbench_here):
    path = tmp_path / "fit.toml"
    path.write_text(SUITE.format(memory=f"memory_per_rank = {value}"))
    with pytest.raises(FileError, match=message) as caught:
        expand_suite(path)
    assert str(path) in str(caught.value)
    result = dtbench_here("run", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and not (tmp_path / "out").exists()
    assert len(result.stderr.strip().splitlines()) == 1


def test_memory_per_rank_is_in_the_spec_and_the_run_id(tmp_path):
    path = tmp_path / "fit.toml"
    path.write_text(SUITE.format(memory='memory_per_rank = "400KB"'))
    specs = expand_suite(path)
    assert {s.memory_per_rank for s in specs} == {400_000}
    assert all("-mem400KB-" in s.run_id for s in specs)
    path.write_text(SUITE.format(memory=""))
    assert all("mem" not in s.run_id and s.memory_per_rank is None for s in expand_suite(path))


def test_a_run_that_does_not_fit_stops_before_its_first_step_in_one_line(tmp_path, dtbench_here):
    """ddp on digits-mlp plans 443,428 bytes per rank, gpipe on 3 ranks 358,400 at most (its allocator peak: 350,208;
    on 2 ranks it needs 437.8 KB): a 400 KB budget refuses the first and trains the second. The refused run is no
    crash: exit 0, its folder says why, nothing trained."""
    path = tmp_path / "fit.toml"
    path.write_text(SUITE.format(memory='memory_per_rank = "400KB"'))
    result = dtbench_here("run", str(path), "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/2 runs completed. 1 did not fit memory_per_rank." in result.stdout
    ddp, gpipe = (next((tmp_path / "fit").glob(f"{m}-*")) for m in ("ddp", "gpipe"))
    status = json.loads((ddp / "status.json").read_text())
    assert status["state"] == "does_not_fit"
    line = status["error"]["message"]
    assert "\n" not in line and line.startswith("does not fit: rank 0 needs 443.4 KB > memory_per_rank 400.0 KB")
    assert status["final"] == {"steps": 0, "planned_memory_bytes": 443_428, "memory_per_rank": 400_000}
    kinds = {json.loads(line)["kind"] for line in (ddp / "metrics.jsonl").read_text().splitlines()}
    assert "train" not in kinds and "eval" not in kinds and "memory" in kinds
    done = json.loads((gpipe / "status.json").read_text())
    assert done["state"] == "completed"
    assert done["final"]["planned_memory_bytes"] <= 400_000

    report = dtbench_here("report", str(tmp_path / "fit"))
    assert report.returncode == 0, report.stderr
    summary = pd.read_csv(tmp_path / "fit" / "report" / "summary.csv").set_index("method")
    assert summary.loc["ddp", "state"] == "does_not_fit"
    assert summary.loc["ddp", "planned_memory_bytes"] == 443_428 and summary.loc["ddp", "memory_per_rank"] == 400_000
    # held: the first stage's saved input is the step's batch (inputs, not measured by kind), not activations
    assert summary.loc["gpipe", "held_memory_bytes"] == 230_912
    page = (tmp_path / "fit" / "report" / "index.html").read_text()
    assert "does not fit (needs 443.4 KB &gt; 400.0 KB)" in page
    assert "Emulated device memory" in page

    again = dtbench_here("run", str(path), "--out", str(tmp_path), "--resume")
    assert again.returncode == 0 and "does not fit earlier, skipped (--resume)" in again.stdout


def test_every_run_records_its_plan_without_a_budget(tmp_path, dtbench_here):
    path = tmp_path / "fit.toml"
    path.write_text(SUITE.format(memory="").replace('name = "fit"', 'name = "free"'))
    result = dtbench_here("run", str(path), "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    for run in (p.parent for p in (tmp_path / "free").glob("*/spec.json")):
        final = json.loads((run / "status.json").read_text())["final"]
        assert final["memory_per_rank"] is None
        # the plan counts the step's temporaries and its batch besides what held measures by kind
        assert final["planned_memory_bytes"] >= final["held_memory_bytes"] > 0


def test_a_claim_on_planned_bytes_pairs_runs_that_did_not_fit():
    from harness.claims.evaluate import paired_values

    rows = [{"label": label, "workload": "w", "network": "", "seed": seed, "state": state, "noisy": False,
             "planned_memory_bytes": planned, "final_loss": loss, "train_time_s": 1.0}
            for seed in range(3)
            for label, state, planned, loss in (("apapo", "completed", 3.8e6, 2.5), ("ddp", "does_not_fit", 8.2e6,
                                                                                         float("nan")))]
    table = pd.DataFrame(rows)
    apapo, ddp = table["label"] == "apapo", table["label"] == "ddp"
    plans = paired_values(table, apapo, ddp, "planned_memory_bytes")
    assert len(plans) == 3 and (plans["baseline"] == 8.2e6).all()
    assert paired_values(table, apapo, ddp, "final_loss").empty  # a refused run trained nothing: no loss to pair
