"""The data-parallel cost model of one configuration (ddp, or a compressed ddp), calibrated on its measured runs and
projected to other world sizes and links."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scipy.optimize import brentq

from harness.project.dataparallel import DataParallelCosts, data_parallel_step, ddp_buckets
from harness.project.host import DEDICATED, Host, host_of
from harness.project.links import Link
from harness.project.measured import RunMeasure
from harness.project.model import Projected, weighted
from harness.project.profile import BlockCosts


@dataclass
class DataParallelModel:
    """One data-parallel configuration, calibrated.

    profile: the model's block costs over batch sizes; scale: in-run compute / profiled compute (the contention of
    the calibration runs, which every projected compute keeps); compress_s, decompress_s: per step at the
    calibration world size; payload_mix: (payload / fp32 bytes, share of steps); collective: how payloads travel;
    host_factor: how much sharing its host's cores slowed the calibration's compute (1 when every rank had its own;
    host.Host.all_at_once), taken out of every projection.
    """

    label: str
    method: str
    batch_size: int
    world_size: int
    profile: BlockCosts
    scale: float = 1.0
    host_factor: float = 1.0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    payload_mix: list[tuple[float, float]] = field(default_factory=lambda: [(1.0, 1.0)])
    collective: str = "all_reduce"
    notes: list[str] = field(default_factory=list)

    def costs(self, world_size: int, batch: int, payload_ratio: float, scale: float | None = None
              ) -> tuple[DataParallelCosts, bool]:
        """The step's costs on one of `world_size` ranks at global batch `batch`, and whether the per-rank batch
        lies outside the profiled sizes. Decoding all-gathered payloads grows with the ranks:
        decompress(N) = decompress(N_cal) · N / N_cal; all-reduced payloads decode once."""
        forward, backward, extrapolated = self.profile.at(batch / world_size)
        decode = self.decompress_s * (world_size / self.world_size if self.collective == "all_gather" else 1.0)
        costs = DataParallelCosts(forward, backward, self.profile.optimizer_s, ddp_buckets(self.profile.param_bytes),
                                  self.compress_s, decode, payload_ratio, self.collective)
        return costs.scaled(self.scale if scale is None else scale), extrapolated

    def project(self, world_size: int, link: Link, batch: int | None = None, scale: float | None = None,
                host: Host = DEDICATED) -> Projected:
        """The mean step over the payload mix (dataparallel.data_parallel_step for each payload ratio). On a host
        whose cores the ranks share, every rank computes at once: compute and compression compute are slowed by
        host.all_at_once() over the calibration's own (host_factor)."""
        batch = batch or self.batch_size
        parts, notes = [], list(self.notes)
        sharing = host.all_at_once() / self.host_factor
        for ratio, share in self.payload_mix:
            costs, extrapolated = self.costs(world_size, batch, ratio, scale)
            if sharing != 1.0:
                costs = replace(costs.scaled(sharing), compress_s=costs.compress_s * sharing,
                                decompress_s=costs.decompress_s * sharing)
            parts.append((data_parallel_step(costs, world_size, link), share))
        if extrapolated:
            notes.append(f"per-rank batch {batch / world_size:g} outside the profiled sizes: compute extrapolated")
        if batch % world_size:
            notes.append(f"batch {batch} does not split evenly over {world_size} ranks")
        return Projected(weighted(parts), notes=notes)


def calibrate_data_parallel(measures: Sequence[RunMeasure], profile: BlockCosts, link: Link) -> DataParallelModel:
    """Fit the compute scale so that the model reproduces the mean measured step of `measures` (the seeds of one
    configuration at the calibration world size and network) on `link`: step(scale) = measured, solved by Brent's
    method on [1e-3, 1e3] (step grows with the scale)."""
    first = measures[0]
    host = host_of(first.spec, first.run.manifest)
    model = DataParallelModel(first.label, str(first.spec.get("method")), first.batch_size, first.world_size,
                              profile, host_factor=host.all_at_once())
    compression = [m.compression for m in measures if "payload_bytes" in m.compression]
    if compression:
        model.compress_s = statistics.fmean(c.get("compress_s", 0.0) for c in compression)
        model.decompress_s = statistics.fmean(c.get("decompress_s", 0.0) for c in compression)
        model.payload_mix = first.payload_mix or [(1.0, 1.0)]
        model.collective = first.collective or infer_collective(first)
        if first.collective is None:
            model.notes.append(f"collective not recorded: assumed {model.collective}")
    measured = statistics.fmean(m.step_s for m in measures)

    def gap(scale: float) -> float:  # on the calibration's own host: its sharing is in what it measured
        return model.project(model.world_size, link, scale=scale, host=host).parts.step_s - measured

    if gap(1e-3) >= 0:
        model.scale = 1e-3
        model.notes.append("communication and compression alone exceed the measured calibration step")
    elif gap(1e3) <= 0:
        model.scale = 1e3
    else:
        model.scale = brentq(gap, 1e-3, 1e3, xtol=1e-9, rtol=1e-9)
    return model


def infer_collective(measure: RunMeasure) -> str:
    """all_reduce or all_gather from the bytes a rank sent per step against its payload: 2(W-1)/W for all-reduce,
    W-1 for all-gather; the two agree at W = 2, where all_gather (the costlier at W > 2) is assumed."""
    world = measure.world_size
    payload = measure.compression.get("payload_bytes", math.nan)
    train = measure.run.metrics[measure.run.metrics["kind"] == "train"]
    if world <= 2 or not payload or "bytes_sent" not in train.columns or not len(train):
        return "all_gather"
    last = train.dropna(subset=["bytes_sent", "step"]).iloc[-1]
    ratio = float(last["bytes_sent"]) / float(last["step"]) / payload
    return "all_reduce" if abs(ratio - 2 * (world - 1) / world) < abs(ratio - (world - 1)) else "all_gather"
