"""Projection of run folders made with known synthetic costs recovers them: the calibration finds the compute scale
and the pipeline's overhead, every held-out run (other networks, world sizes, splits) is projected to its step time
and time to target, and `dtbench project` writes its files (or exits 2 on bad input)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.project.dpmodel import DataParallelModel
from harness.project.links import link_of
from harness.project.pipemodel import SIMULATED_STEPS, PipelineModel, StageCosts, pipeline_tasks
from harness.project.profile import BlockCosts
from harness.project.simulate import period_s, simulate
from harness.project.suite import PROFILES_FILE, Settings, calibrate_suite
from harness.project.tables import error_summary, projection_table, validation_table

OPTIONS = {"in_features": 8, "hidden": 16, "depth": 2, "classes": 10, "num_train": 512, "num_test": 64}
STEPS, TARGET_STEP = 20, 12
# Three blocks whose forward and backward grow linearly with the batch; 4 B of activation per sample per block.
PROFILE = BlockCosts(
    batch_sizes=(1, 16, 32, 64, 128),
    forward_s=tuple(tuple(1e-4 * b * k for k in (1, 2, 0.5)) for b in (1, 16, 32, 64, 128)),
    backward_s=tuple(tuple(2e-4 * b * k for k in (1, 2, 0.5)) for b in (1, 16, 32, 64, 128)),
    activation_bytes=(4096.0, 4096.0, 40.0),
    param_bytes=((200_000, 4000), (400_000, 4000), (40_000, 40)),
    optimizer_s=1e-3)
SCALE = 1.7  # what the synthetic runs' compute costs over the profile


def write_run(suite: Path, method: str, world_size: int, network: str, step_times: list[float],
              params: dict | None = None, extra: list[dict] | None = None, traces: list[list[list]] | None = None,
              partition: dict | None = None) -> None:
    """A completed run folder: train records (ranks x steps, step k ending at sum of step_times[:k]), evals that
    reach the 0.5 target at TARGET_STEP, traces and partition.json when given."""
    params = dict(params or {})
    shown = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    label = f"{method}{' ' + shown if shown else ''} x{world_size}" + (f" @ {network}" if network else "")
    run_id = label.replace(" ", "-").replace("@", "at").replace("=", "")
    run = suite / run_id
    run.mkdir(parents=True)
    spec = {"suite": suite.name, "run_id": run_id, "label": label, "method": method, "workload": "synthetic-mlp",
            "workload_options": OPTIONS, "world_size": world_size, "seed": 0, "threads_per_rank": 1,
            "params": {"batch_size": 128, **params}, "budget": {"target_accuracy": 0.5},
            "network": {"rate": network, "latency": None} if network else None}
    (run / "spec.json").write_text(json.dumps(spec))
    (run / "status.json").write_text(json.dumps({"state": "completed"}))
    records, clock = [], 0.0
    for step, seconds in enumerate(step_times, start=1):
        clock += seconds
        for rank in range(world_size):
            record = {"kind": "train", "rank": rank, "step": step, "train_time_s": clock, "wall_time_s": clock}
            record.update((extra or [{}] * len(step_times))[step - 1].get(rank, {}) if extra else {})
            records.append(record)
        if step % 4 == 0:
            records.append({"kind": "eval", "rank": 0, "step": step, "train_time_s": clock,
                            "test_accuracy": 0.6 if step >= TARGET_STEP else 0.3})
    for step, events in enumerate(traces or [], start=1):
        for worker, rows in enumerate(events):
            records.append({"kind": "trace", "rank": worker, "worker": worker, "step": step, "events": rows})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    if partition:
        (run / "partition.json").write_text(json.dumps(partition))


def truth_dp(method: str, network: str, world_size: int, **compression) -> float:
    model = DataParallelModel("x", method, 128, 2, PROFILE, scale=SCALE, **compression)
    return model.project(world_size, Settings().link(network, emulated=True)).parts.step_s


QSGD = {"compress_s": 0.004, "decompress_s": 0.003, "collective": "all_gather"}
MIX = [0.25] * 9 + [0.01] * 10  # payload / dense of steps 2..20 (a DGC-like warm-up)


def write_qsgd(suite: Path, network: str) -> None:
    times = [0.05] + [truth_dp("qsgd", network, 2, payload_mix=[(r, 1.0)], **QSGD) for r in MIX]
    extra = [{}] + [{rank: {"compress_s": 0.004, "decompress_s": 0.003, "payload_bytes": 1000 * r,
                            "dense_bytes": 1000, "collective": "all_gather"} for rank in range(2)} for r in MIX]
    write_run(suite, "qsgd", 2, network, times, {"bits": 4}, extra)


STAGES = [(0, 2), (2, 3)]
OVERHEAD = 0.004


def stage_costs(microbatch: float) -> list[StageCosts]:
    forward, backward, _ = PROFILE.at(microbatch)
    return [StageCosts(sum(forward[a:b]) * SCALE, sum(backward[a:b]) * SCALE, 0.002, 0.0005,
                       PROFILE.activation_bytes[b - 1] * microbatch) for a, b in STAGES]


def gpipe_truth(network: str, microbatches: int) -> tuple[float, list]:
    """Step time and the traces of four steps of a gpipe run with the synthetic costs on `network`."""
    costs = stage_costs(128 / microbatches)
    spans = simulate(pipeline_tasks("gpipe", costs, microbatches, SIMULATED_STEPS),
                     Settings().link(network, emulated=True))
    traces = [[[[s.task.op, s.task.mb - step * microbatches if s.task.mb >= 0 else -1, s.start, s.end, -1,
                 s.task.stage, 0, 0] for s in rank if s.task.step == step] for rank in spans] for step in range(4)]
    return period_s(spans) + OVERHEAD, traces


def write_gpipe(suite: Path, network: str, microbatches: int) -> None:
    step, traces = gpipe_truth(network, microbatches)
    message = PROFILE.activation_bytes[1] * 128 / microbatches
    extra = [{0: {"bytes_by_category": {"activations": [k * microbatches * message, 0]}},
              1: {"bytes_by_category": {"activation_grads": [k * microbatches * message, 0]}}}
             for k in range(1, STEPS + 1)]
    partition = {"stages": [{"stage": s, "blocks": list(r)} for s, r in enumerate(STAGES)],
                 "profiles": [{"param_bytes": sum(p)} for p in PROFILE.param_bytes]}
    write_run(suite, "gpipe", 2, network, [step] * STEPS, {"microbatches": microbatches}, extra,
              traces, partition)


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    folder = tmp_path / "synthetic"
    for network in ("unlimited", "1gbit", "100mbit"):
        write_run(folder, "ddp", 2, network, [truth_dp("ddp", network, 2)] * STEPS)
        write_qsgd(folder, network)
        write_gpipe(folder, network, 4)
    write_run(folder, "ddp", 1, "unlimited", [truth_dp("ddp", "unlimited", 1)] * STEPS)
    write_gpipe(folder, "100mbit", 8)  # another split, held out
    key = json.dumps(["synthetic-mlp", OPTIONS, 1], sort_keys=True)
    (folder / "report").mkdir()
    (folder / "report" / PROFILES_FILE).write_text(json.dumps({key: PROFILE.to_dict()}))
    return folder


def test_calibration_recovers_the_synthetic_costs(suite):
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    assert (calibrated.network, calibrated.world_size) == ("unlimited", 2)
    models = {c.model.label: c.model for c in calibrated.calibrations}
    assert set(models) == {"ddp", "qsgd bits=4", "gpipe microbatches=4"}
    assert models["ddp"].scale == pytest.approx(SCALE, rel=1e-6)
    assert models["qsgd bits=4"].scale == pytest.approx(SCALE, rel=1e-6)
    mix = models["qsgd bits=4"].payload_mix
    assert [r for r, _ in mix] == [0.01, 0.25]
    assert [w for _, w in mix] == pytest.approx([10 / 19, 9 / 19])
    gpipe = models["gpipe microbatches=4"]
    assert isinstance(gpipe, PipelineModel)
    assert gpipe.overhead_s == pytest.approx(OVERHEAD, abs=1e-9)
    assert gpipe.forward_scale == pytest.approx([SCALE] * 3)
    assert gpipe.generated_overhead_s == pytest.approx(OVERHEAD, abs=1e-9)
    assert all(c.steps_to_target == TARGET_STEP for c in calibrated.calibrations)


def test_every_held_out_run_is_projected_to_what_it_measured(suite):
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    validation = validation_table(calibrated, Settings())
    assert len(validation) == 8  # 3 configurations x 2 networks, ddp on 1 rank, gpipe with 8 microbatches
    assert validation["step_error"].abs().max() < 1e-6, validation[["label", "network", "step_error"]]
    # time to target = steps to target x the mean step: exact where every step takes as long (not qsgd's mix)
    steady = validation[~validation["label"].str.startswith("qsgd")]
    assert steady["time_to_target_error"].abs().max() < 1e-6
    assert validation["time_to_target_error"].abs().max() < 0.2
    assert error_summary(validation)["configurations"] == 8


def test_the_grid_has_every_configuration_at_every_size_and_network(suite):
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    table = projection_table(calibrated, [2, 4, 64], ["1gbit", "10gbit"], Settings(), "ddp")
    assert len(table) == 3 * 3 * 2
    ddp = table[table["label"] == "ddp"]
    assert (ddp["speedup"] == 1.0).all()
    at_2 = ddp[(ddp["world_size"] == 2) & (ddp["network"] == "1gbit")].iloc[0]
    plain = DataParallelModel("x", "ddp", 128, 2, PROFILE, scale=SCALE).project(2, link_of("1gbit"))
    assert at_2["step_time_s"] == pytest.approx(plain.parts.step_s)  # targets are plain links, without tbf's burst
    assert at_2["time_to_target_s"] == pytest.approx(TARGET_STEP * at_2["step_time_s"])
    gpipe = table[table["label"] == "gpipe microbatches=4"].set_index("world_size")
    # 64 ranks, 3 blocks: 2-rank pipelines, 32 data-parallel copies of them, each on 128 / 32 samples
    assert gpipe.loc[64, "note"].str.contains("2 ranks per pipeline x 32 data-parallel copies").all()
    assert gpipe.loc[64, "step_time_s"].notna().all()
    parts = table[["compute_s", "compression_s", "exposed_comm_s", "bubble_s", "other_s"]].sum(axis=1)
    finite = table["step_time_s"].notna()
    assert parts[finite].to_numpy() == pytest.approx(table["step_time_s"][finite].to_numpy())
    # more ranks shrink compute and grow all-reduce: at 64 ranks over 1 Gbit ddp is communication-bound
    big = ddp[(ddp["world_size"] == 64) & (ddp["network"] == "1gbit")].iloc[0]
    assert big["exposed_comm_s"] > big["compute_s"]
    assert link_of("1gbit").bandwidth < link_of("10gbit").bandwidth


def test_crossovers_are_found_against_the_baseline(suite):
    from harness.net.spec import parse_rate
    from harness.project.crossover import crossover_table, rate_text
    from harness.project.tables import project_one

    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    table = crossover_table(calibrated, [2, 64], Settings(), "ddp").set_index(["label", "world_size"])
    assert set(table.index.get_level_values("label")) == {"qsgd bits=4", "gpipe microbatches=4"}
    assert table.loc[("gpipe microbatches=4", 64), "throughput_crossover"] != "not projected"  # copies of 2 ranks
    qsgd = table.loc[("qsgd bits=4", 2)]
    # slower links favour the smaller payload, faster ones ddp (no compression compute): one crossover between
    assert qsgd["faster_at_slowest"] and not qsgd["faster_at_fastest"]
    rate = parse_rate(qsgd["throughput_crossover"])
    calibration = {c.model.label: c for c in calibrated.calibrations}
    def per_sample(label, bps):
        return project_one(calibration[label], 2, rate_text(bps), Settings()).parts.step_s / 128
    assert per_sample("qsgd bits=4", rate / 2) < per_sample("ddp", rate / 2)
    assert per_sample("qsgd bits=4", rate * 2) > per_sample("ddp", rate * 2)


def test_the_verb_writes_projection_and_validation_files(suite, capsys):
    assert main(["project", str(suite), "--world-sizes", "2,8", "--network", "1gbit,10gbit", "--validate"]) == 0
    report = suite / "report"
    table = pd.read_csv(report / "projection.csv")
    assert list(table.columns[:8]) == ["method", "workload", "label", "world_size", "network", "batch_size",
                                       "step_time_s", "samples_per_s"]
    assert {"time_to_target_s", "compute_s", "compression_s", "exposed_comm_s", "bubble_s"} <= set(table.columns)
    assert set(table["network"]) == {"1gbit", "10gbit"}
    for name in ("projection.png", "projection_validation.png", "projection_validation.csv"):
        assert (report / name).stat().st_size > 0
    captured = capsys.readouterr()
    assert "8 held-out configurations" in captured.out
    assert "Assumption: time to target" in captured.out
    # each phase a person waits on says so on stderr (a bar on a terminal); stored block costs: no profiling
    for phase in ("crossovers (configuration x world size) (4 pairs)", "validation (held-out configurations)",
                  "page figures (3 figures)"):
        assert f"dtbench project: {phase}" in captured.err
    assert "profiling" not in captured.err


@pytest.mark.parametrize(("args", "message"), [
    (["--network", "fast"], "rate 'fast'"), (["--world-sizes", "2,x"], "--world-sizes"),
    (["--world-sizes", "0"], "--world-sizes"), (["--latency", "3"], "latency"),
    (["--baseline", "nope"], "--baseline 'nope'"), (["--calibrate-on", "300mbit"], "no run on network"),
    (["--quantile", "1.5"], "--quantile"), (["--calibration-world-size", "4"], "no run with world size 4"),
])
def test_bad_input_is_one_line_and_exit_2(suite, capsys, args, message):
    before = sorted(p.name for p in (suite / "report").iterdir())
    assert main(["project", str(suite), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert sorted(p.name for p in (suite / "report").iterdir()) == before


def test_a_missing_folder_is_exit_2(tmp_path, capsys):
    assert main(["project", str(tmp_path / "nothing")]) == 2
    assert "no such results folder" in capsys.readouterr().err


def test_help_explains_the_verb(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["project", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--world-sizes" in out and "--validate" in out and "alpha-beta" in out


def test_a_configuration_without_a_run_at_the_calibration_size_is_calibrated_at_its_own(suite):
    """ddp with another lr ran only on 3 ranks: it is calibrated there (not left out), and said so; with an
    explicit --calibration-world-size it is not calibrated."""
    write_run(suite, "ddp", 3, "unlimited", [truth_dp("ddp", "unlimited", 3)] * STEPS, {"lr": 0.2})
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    models = {c.model.label: c.model for c in calibrated.calibrations}
    assert models["ddp lr=0.2"].world_size == 3 and models["ddp"].world_size == 2
    assert any("calibrated at 3 ranks" in note for note in calibrated.notes)
    strict = calibrate_suite(suite, Settings(calibration_world_size=2), suite / "report")
    assert "ddp lr=0.2" not in {c.model.label for c in strict.calibrations}
