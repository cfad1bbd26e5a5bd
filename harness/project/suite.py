"""A suite folder calibrated for projection: its runs measured, the calibration runs chosen and grouped into one
model per configuration, and the block costs profiled (or read back from the report folder)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from harness.project.dpmodel import DataParallelModel, calibrate_data_parallel
from harness.project.links import UNSHAPED_RATE_BPS, WIRE_EFFICIENCY, Link, link_of
from harness.project.measured import RunMeasure, measure
from harness.project.pipemodel import PipelineModel, calibrate_pipeline
from harness.project.profile import BlockCosts, default_batch_sizes, profile_workload
from harness.project.progress import phase
from harness.results import load_suite

PROFILES_FILE = "projection_profiles.json"
Model = DataParallelModel | PipelineModel


@dataclass(frozen=True)
class Settings:
    """How links are modelled and which runs calibrate. latency_s: alpha of networks that name no latency;
    unshaped_rate_bps: what 'unlimited' and loopback carry; efficiency: payload share of a shaped rate;
    calibration_network / calibration_world_size: None picks 'unlimited' (else loopback) and 2 (else the
    smallest); emulated_targets: give projection targets the emulation's tbf burst, as the runs had; quantile:
    which quantile of a run's per-step times (and traced durations) stands for it (measured.step_seconds)."""

    latency_s: float = 0.0
    unshaped_rate_bps: float = UNSHAPED_RATE_BPS
    efficiency: float = WIRE_EFFICIENCY
    calibration_network: str | None = None
    calibration_world_size: int | None = None
    emulated_targets: bool = False
    quantile: float = 0.5

    def link(self, network: str, emulated: bool | None = None) -> Link:
        """The Link of a network: with the emulation's tbf burst for runs of this harness (emulated=True), and
        for projection targets only with `emulated_targets` (None)."""
        emulated = self.emulated_targets if emulated is None else emulated
        return link_of(network, self.latency_s, self.unshaped_rate_bps, self.efficiency, emulated)


@dataclass
class Calibration:
    """One configuration's model and the runs it was fitted on (its seeds)."""

    model: Model
    runs: list[RunMeasure]

    @property
    def key(self) -> str:
        return self.runs[0].key

    @property
    def workload(self) -> str:
        """The workload its runs trained (a configuration is compared only with others of it)."""
        return str(self.runs[0].spec.get("workload"))

    @property
    def steps_to_target(self) -> float | None:
        """Median over the seeds that reached the target of the steps they took; None when none did."""
        steps = [m.steps_to_target for m in self.runs if m.steps_to_target is not None]
        return statistics.median(steps) if steps else None


@dataclass
class CalibratedSuite:
    """Every measured run of a suite, the calibration network and world size, and one Calibration per
    configuration (key and shape) that has runs there."""

    measures: list[RunMeasure]
    network: str
    world_size: int
    calibrations: list[Calibration] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: configuration key -> its calibration world size where it differs from `world_size` (no run there)
    own_sizes: dict[str, int] = field(default_factory=dict)

    def is_calibration(self, run: RunMeasure) -> bool:
        return run.network == self.network and run.world_size == self.own_sizes.get(run.key, self.world_size)

    def for_run(self, run: RunMeasure) -> Calibration | None:
        """The calibration of a run's configuration: the one of the same shape if any, else the first."""
        same = [c for c in self.calibrations if c.key == run.key]
        exact = [c for c in same if shape(c.runs[0]) == shape(run)]
        return (exact or same or [None])[0]


def shape(run: RunMeasure) -> tuple:
    """What differs between calibrations of one configuration: batch, microbatches and partition."""
    return run.batch_size, run.microbatches, json.dumps(run.params.get("partition"), default=str)


def choose(measures: list[RunMeasure], settings: Settings) -> tuple[str, int]:
    networks = {m.network for m in measures}
    network = settings.calibration_network
    if network is None:
        network = "unlimited" if "unlimited" in networks else ("" if "" in networks else sorted(networks)[0])
    sizes = sorted({m.world_size for m in measures if m.network == network})
    if not sizes:
        raise ValueError(f"no run on network {network or 'loopback'!r} to calibrate on "
                         f"(networks: {', '.join(sorted(n or 'loopback' for n in networks))})")
    size = settings.calibration_world_size or (2 if 2 in sizes else sizes[0])
    if size not in sizes:
        raise ValueError(f"no run with world size {size} on {network or 'loopback'} to calibrate on "
                         f"(world sizes there: {', '.join(map(str, sizes))})")
    return network, size


def calibrate_suite(suite_dir: Path, settings: Settings, report_dir: Path, reprofile: bool = False
                    ) -> CalibratedSuite:
    """Measure every completed run, pick the calibration runs, profile the workloads and fit one model per
    configuration. Raises ValueError (one line) when nothing can be calibrated."""
    runs = [r for r in load_suite(suite_dir) if r.state == "completed"]
    measures = [m for m in (measure(r, settings.quantile) for r in runs) if m.step_s == m.step_s]
    if not measures:
        raise ValueError(f"{suite_dir}: no completed run with train records")
    network, world_size = choose(measures, settings)
    suite = CalibratedSuite(measures, network, world_size)
    if settings.calibration_world_size is None:  # a configuration with no run at that size: its smallest
        sizes: dict[str, set[int]] = {}
        for m in measures:
            if m.network == network:
                sizes.setdefault(m.key, set()).add(m.world_size)
        for key, held in sizes.items():
            several = [n for n in held if n > 1]  # a 1-rank run (sgd) has no communication to project from
            if world_size not in held and several:
                suite.own_sizes[key] = min(several)
                label = next(m.label for m in measures if m.key == key and m.world_size == min(several))
                suite.notes.append(f"{label}: calibrated at {min(several)} ranks (it has no run at {world_size})")
    groups: dict[tuple, list[RunMeasure]] = {}
    for m in measures:
        if suite.is_calibration(m):
            groups.setdefault((m.key, shape(m)), []).append(m)
    profiles = profiles_for([g[0] for g in groups.values()], measures, report_dir / PROFILES_FILE, reprofile)
    link = settings.link(network, emulated=True)
    for group in groups.values():
        profile = profiles.get(profile_key(group[0]))
        if group[0].is_pipeline:
            model: Model = calibrate_pipeline(group, profile, link)
        elif profile is None:
            suite.notes.append(f"{group[0].label}: no block costs, not projected")
            continue
        else:
            model = calibrate_data_parallel(group, profile, link)
        suite.calibrations.append(Calibration(model, group))
    return suite


def profile_key(run: RunMeasure) -> str:
    """Which block costs a run needs: workload, its options and threads per rank."""
    spec = run.spec
    return json.dumps([spec.get("workload"), spec.get("workload_options"), spec.get("threads_per_rank")],
                      sort_keys=True, default=str)


def local_batch(run: RunMeasure) -> float:
    """The batch one forward of the run sees: per rank for data parallel, per microbatch for pipelines."""
    if run.is_pipeline:
        return run.batch_size / run.microbatches  # 1 for a method without microbatches (pipedream)
    return run.batch_size / run.world_size


def profiles_for(calibration: list[RunMeasure], measures: list[RunMeasure], path: Path, reprofile: bool
                 ) -> dict[str, BlockCosts]:
    """Block costs per profile_key: read from `path` when it holds them at every exact batch the calibration runs
    used, else measured here (powers of two up to the largest global batch, and those exact batches) and saved."""
    stored = json.loads(path.read_text()) if path.is_file() and not reprofile else {}
    profiles, missing, changed = {}, [], False
    for key in dict.fromkeys(profile_key(m) for m in calibration):
        exact = sorted({int(local_batch(m)) for m in calibration if profile_key(m) == key})
        if key in stored and set(exact) <= set(stored[key]["batch_sizes"]):
            profiles[key] = BlockCosts.from_dict(stored[key])
        else:
            missing.append((key, exact))
    for key, exact in phase(missing, "profiling block costs (stored for next time)", "workload"):
        largest = max(m.batch_size for m in measures if profile_key(m) == key)
        workload, options, threads = json.loads(key)
        try:
            costs = profile_workload(workload, options or {}, default_batch_sizes(largest, exact), threads or 1)
        except Exception as exc:  # a workload whose data is missing here: projected without block costs
            print(f"dtbench project: cannot profile {workload}: {exc}")
            continue
        profiles[key] = costs
        stored[key] = costs.to_dict()
        changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=1))
    return profiles
