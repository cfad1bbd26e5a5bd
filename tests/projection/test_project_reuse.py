"""A projection computes each thing once: the crossover scan simulates one pipeline shape once per link rate (not
once per scan, nor once more on a free link per rate), builds a shape's schedule once, gives the very numbers a cold
model gives (issue 50: 289 s on the smoke, nearly all of it the crossovers' repeated simulations)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from test_project_runs import suite  # noqa: F401 - the fixture

from harness.project import pipemodel
from harness.project.crossover import SCAN_BPS, crossover_table, rate_text
from harness.project.pipemodel import PipelineModel
from harness.project.suite import Settings, calibrate_suite


def test_the_crossover_scan_simulates_each_shape_once_per_rate(suite, monkeypatch):  # noqa: F811
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    simulated: Counter = Counter()
    generated: Counter = Counter()
    real_simulate, real_generated = pipemodel.simulate, PipelineModel.generated

    def counting_simulate(ranks, link):
        simulated[tuple(map(tuple, ranks)), link] += 1
        return real_simulate(ranks, link)

    def counting_generated(self, world_size, batch, microbatches, ranges):
        generated[id(self), world_size, batch, microbatches] += 1
        return real_generated(self, world_size, batch, microbatches, ranges)

    monkeypatch.setattr(pipemodel, "simulate", counting_simulate)
    monkeypatch.setattr(PipelineModel, "generated", counting_generated)
    table = crossover_table(calibrated, [2, 64], Settings(), "ddp")
    gpipe = table[table["label"] == "gpipe microbatches=4"]
    assert len(gpipe) == 2 and "not projected" not in set(gpipe["throughput_crossover"])
    # every rate of the scan was asked for (twice over: throughput and time to target), and a shape's simulation on
    # one link ran once: before, each scan ran its own, plus the free link's at every rate
    rates = {link.name for _, link in simulated}
    assert {rate_text(bps) for bps in SCAN_BPS} <= rates
    repeated = {key[1].name: n for key, n in simulated.items() if n > 1}
    assert not repeated, f"simulated more than once: {sorted(repeated.items())[:5]}"
    shapes = {ranks for ranks, _ in simulated}
    assert len(shapes) == 2  # the traced shape at 2 ranks, the copies of the pipeline at 64
    assert len(simulated) <= 2 * (len(rates) + 1)  # + the free link's, once per shape
    # the 64-rank order (copies of a 2-rank pipeline) is generated once, not once per rate
    assert generated and max(generated.values()) == 1


def test_a_warm_model_projects_what_a_cold_one_does(suite):  # noqa: F811
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    model = next(c.model for c in calibrated.calibrations if isinstance(c.model, PipelineModel))
    settings = Settings()
    for network in ("100mbit", "1gbit", "37mbit", "100mbit"):
        for world_size in (2, 8, 64):
            cold = dataclasses.replace(model)  # the same calibration, nothing reused yet
            assert not cold.shapes and not cold.free_periods
            assert model.project(world_size, settings.link(network)) == cold.project(world_size,
                                                                                     settings.link(network))
    assert model.shapes and model.free_periods



def test_a_partition_the_schedule_cannot_take_is_a_note_not_a_crash(suite):  # noqa: F811
    """A held-out pipedream run with replicas = [2, 1] has 2 stages on 3 ranks; its 3-rank schedule asks for 3
    stages. `dtbench project --validate` on the smoke stopped with an IndexError; the row is unprojected with why."""
    calibrated = calibrate_suite(suite, Settings(), suite / "report")
    model = next(c.model for c in calibrated.calibrations if isinstance(c.model, PipelineModel))
    two_stages = [(0, 1), (1, model.profile.blocks)]
    projected = dataclasses.replace(model).project(3, Settings().link("1gbit"), ranges=two_stages)
    assert projected.parts.step_s != projected.parts.step_s  # NaN: no projection
    assert any("replicated stages are not re-shaped" in note for note in projected.notes)
