"""Runs whose ranks shared a host's cores: the host read from a run's manifest, processor sharing in data-parallel
steps and simulated pipelines, a projection at its own calibration shape equal to its measured step (shared host or
not), and the projection page with each method's validation beside its figure."""

from __future__ import annotations

import json
import math
import statistics

import pandas as pd
import pytest
from test_project_runs import suite  # noqa: F401 - the fixture

from harness.project.host import DEDICATED, Host, host_of, shared_run, sharing
from harness.project.pipemodel import FREE
from harness.project.simulate import Task, simulate
from harness.project.suite import Settings, calibrate_suite
from harness.project.tables import project_one

SPEC = {"world_size": 4, "nodes": 1}


def test_the_host_comes_from_the_manifest():
    assert host_of(SPEC, {"cpu_count": 2, "threads": {"per_rank": 1}}) == Host(2.0, 4, 1)
    assert host_of({"world_size": 8, "nodes": 2}, {"cpu_count": 16, "threads": {"per_rank": [2, 3]}}) == \
        Host(16.0, 4, 3)
    assert host_of(SPEC, None) == DEDICATED and host_of(SPEC, {"cpu_count": None}) == DEDICATED
    assert Host(2.0, 4, 1).all_at_once() == 2.0 and Host(2.0, 2, 1).all_at_once() == 1.0
    assert not DEDICATED.oversubscribed and Host(2.0, 3, 1).oversubscribed


def test_ranks_computing_at_once_share_the_cores():
    """Two independent 1 s forwards on one core take 2 s each (the fixed point of processor sharing); on two cores,
    1 s; a rank computing alone on a shared host is not slowed."""
    ranks = [[Task("forward", 0, 0, 1.0)], [Task("forward", 1, 0, 1.0)]]
    run = lambda tasks: simulate(tasks, FREE)  # noqa: E731
    spans, factor = shared_run(ranks, Host(1.0, 2, 1), run, {0})
    assert factor == pytest.approx(2.0) and [r[0].end for r in spans] == pytest.approx([2.0, 2.0])
    spans, factor = shared_run(ranks, Host(2.0, 2, 1), run, {0})
    assert factor == 1.0 and [r[0].end for r in spans] == [1.0, 1.0]
    apart = [[Task("forward", 0, 0, 1.0)], [Task("recv_act", 1, 0), Task("forward", 1, 0, 1.0)]]
    apart[0].append(Task("send_act", 0, 0, 0.0, 1.0))
    assert sharing(simulate(apart, FREE), Host(1.0, 2, 1), {0}) == pytest.approx(1.0)


def test_data_parallel_compute_is_slowed_by_its_ranks_over_the_cores(suite):  # noqa: F811
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    ddp = next(c for c in calibrated.calibrations if c.model.label == "ddp")
    alone = project_one(ddp, 4, "1gbit", Settings()).parts
    shared = project_one(ddp, 4, "1gbit", Settings(), host=Host(2.0, 4, 1)).parts
    assert shared.compute_s == pytest.approx(2 * alone.compute_s)
    assert shared.step_s > alone.step_s


@pytest.mark.parametrize("cores", [None, 1])
def test_a_projection_at_its_calibration_shape_is_its_measured_step(suite, cores):  # noqa: F811
    """Every configuration projected onto its own calibration runs (world size, network, batch, split, host) gives
    their measured step: exactly, by construction (the compute scale, the pipeline's overhead and the host's
    sharing are fitted there), so its validation error is 0 where every held-out error is measured. Also when the
    calibration runs' ranks shared one core (cores = 1): the sharing taken out and put back cancels."""
    if cores is not None:
        for spec in suite.glob("*/spec.json"):
            (spec.parent / "manifest.json").write_text(json.dumps({"cpu_count": cores, "threads": {"per_rank": 1}}))
    settings = Settings()
    calibrated = calibrate_suite(suite, settings, suite / "report")
    assert len(calibrated.calibrations) == 3
    for calibration in calibrated.calibrations:
        runs = calibration.runs
        first = runs[0]
        host = host_of(first.spec, first.run.manifest)
        assert host.oversubscribed == (cores == 1)
        projected = project_one(calibration, first.world_size, calibrated.network, settings, first.batch_size,
                                first.microbatches, None, emulated=True, host=host)
        measured = statistics.fmean(m.step_s for m in runs)
        assert projected.parts.step_s == pytest.approx(measured, rel=1e-6), calibration.model.label
    # and a dedicated node (one rank per node) is faster than the shared host the calibration ran on
    if cores == 1:
        ddp = next(c for c in calibrated.calibrations if c.model.label == "ddp")
        assert project_one(ddp, 2, "unlimited", settings).parts.compute_s < \
            project_one(ddp, 2, "unlimited", settings, host=Host(1.0, 2, 1)).parts.compute_s


def test_the_page_labels_each_figure_a_projection_with_its_methods_validation(tmp_path):
    from harness.project.page import method_errors, read_validation, render, write_page

    rows = pd.DataFrame([{"method": m, "workload": "digits-mlp", "label": m, "world_size": n, "network": "1gbit",
                          "step_time_s": 0.01 * n, "time_to_target_s": math.nan if m == "gpipe" else 1.0 * n,
                          "speedup": 1.0, "bubble": 0.2, "note": ""} for m in ("ddp", "gpipe") for n in (2, 8, 64)])
    validation = pd.DataFrame([{"method": "ddp", "workload": "synthetic-mlp", "world_size": 3, "network": "1gbit",
                                "step_error": -0.12, "time_to_target_error": math.nan},
                               {"method": "ddp", "workload": "synthetic-mlp", "world_size": 4, "network": "100mbit",
                                "step_error": 0.04, "time_to_target_error": math.nan}])
    validation.to_csv(tmp_path / "projection_validation.csv", index=False)
    read = read_validation(tmp_path)
    page = render(rows, method_errors(read), "Calibrated.", [8, 64])
    assert page.count("Projection, not a measurement") == 2
    assert "step time off by <b>8% median, 12% max</b>" in page and "2 configurations (3, 4 ranks" in page
    assert "<b>Not validated</b>: no held-out run of gpipe" in page
    path = write_page(rows, read, "Calibrated.", tmp_path, [8, 64])
    assert path.name == "projection.html" and "data:image/png;base64," in path.read_text()
    (tmp_path / "old.csv").write_text("label,world_size,network,step_error\nddp,3,1gbit,0.1\n")
    with pytest.raises(ValueError, match="no method column"):
        read_validation(tmp_path / "old.csv")
    with pytest.raises(ValueError, match="no projection_validation.csv there"):
        read_validation(tmp_path / "nowhere")


def test_a_papers_speedup_claim_sits_beside_its_projection_labelled_as_the_papers():
    from harness.project.page import render

    rows = pd.DataFrame([{"method": m, "workload": "digits-resnet", "label": m, "world_size": n, "network": "1gbit",
                          "step_time_s": 0.01, "time_to_target_s": 1.0, "speedup": s, "bubble": 0.1, "note": ""}
                         for m, s in (("ddp", 1.0), ("apapo", 1.31)) for n in (8, 64)])
    page = render(rows, {}, "Calibrated.", [8, 64])
    assert page.count("Paper's claim, 2.8x (not measured here)") == 1
    assert "speed-up over the workload's baseline: 1.31x to 1.31x across its world sizes and networks (projected, " \
           "not measured)" in page
