"""Measuring the hardware a plan is matched to: every rank's compute speed and every link's bandwidth."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Any

import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.comm.tags import Tag
from methods.pipeline.apapo.antichain import Hardware


def time_step(model: nn.Module, example: torch.Tensor, repeats: int = 5) -> float:
    """Median seconds of one forward and backward of `model` on `example` (after one untimed run). Gradients go
    through torch.autograd.grad, so no .grad is written; buffers are restored."""
    saved = [b.detach().clone() for b in model.buffers()]
    params = [p for p in model.parameters() if p.requires_grad]
    times = []
    for run in range(repeats + 1):
        start = time.perf_counter()
        out = model(example)
        torch.autograd.grad(out.float().sum(), params)
        if run:
            times.append(time.perf_counter() - start)
    with torch.no_grad():
        for buffer, value in zip(model.buffers(), saved, strict=True):
            buffer.copy_(value)
    return statistics.median(times)


def measure_speeds(comm: Communicator, model: nn.Module, example: torch.Tensor) -> tuple[float, ...]:
    """Every rank times the same training step (time_step) with its own threads, at the same time (so contention
    for shared cores is in the numbers); speeds[r] = t_0 / t_r, relative to rank 0, which profiles the layers.
    Collective (category `control`)."""
    times = torch.zeros(comm.world_size, dtype=torch.float64)
    if comm.world_size > 1:
        comm.barrier()  # every rank times at once, as every rank will train at once
    times[comm.rank] = time_step(model, example)
    if comm.world_size > 1:
        comm.all_reduce(times, "control")
    return tuple(float(times[0] / t) for t in times)


def measure_bandwidth(comm: Communicator, nbytes: int = 1 << 20, repeats: int = 3) -> tuple[tuple[float, ...], ...]:
    """bandwidth[a][b] in bytes/s: for each pair of ranks in turn, a sends `nbytes` to b and b sends them back,
    `repeats` times after one untimed round trip; 2·nbytes / the median round trip. Ranks outside the pair go on to
    their next pair, so pairs without a common rank overlap. Collective (category `control`)."""
    world, rank = comm.world_size, comm.rank
    table = torch.zeros(world, world, dtype=torch.float64)
    payload = torch.zeros(nbytes, dtype=torch.uint8)
    for a, b in itertools.combinations(range(world), 2):
        if rank not in (a, b):
            continue
        peer = b if rank == a else a
        trips = []
        for run in range(repeats + 1):
            start = time.perf_counter()
            if rank == a:
                comm.send(payload, peer, "control", Tag.BANDWIDTH_PROBE)
                comm.recv(payload, peer, "control", Tag.BANDWIDTH_PROBE)
            else:
                comm.recv(payload, peer, "control", Tag.BANDWIDTH_PROBE)
                comm.send(payload, peer, "control", Tag.BANDWIDTH_PROBE)
            if run:
                trips.append(time.perf_counter() - start)
        if rank == a:
            table[a, b] = table[b, a] = 2 * nbytes / statistics.median(trips)
    if world > 1:
        comm.all_reduce(table, "control")
    return tuple(tuple(float(v) for v in row) for row in table)


def snap(value: float, step: float) -> float:
    """`value` on a geometric grid: 2^(step · round(log2(value) / step)) (step 0.5: powers of sqrt 2; 1: of 2). Measured
    speeds and bandwidths are snapped so that the small run-to-run noise of a measurement does not move the plan:
    equal ranks measured at 0.91 and 1.0 both plan as 1.0."""
    if value <= 0:
        return value
    return 2.0 ** (step * round(math.log2(value) / step))


SPEED_STEP = 0.5  # measured speeds snap to powers of sqrt 2
BANDWIDTH_STEP = 1.0  # measured bandwidths snap to powers of 2


def hardware_for(comm: Communicator, model: nn.Module, example: torch.Tensor, workers: int,
                 speeds: str | list[float], bandwidth: str | float | list[list[float]]
                 ) -> tuple[Hardware, dict[str, Any]]:
    """The Hardware the DP plans for: `speeds` and `bandwidth` as given, or 'measured' (collective) and snapped to a
    grid (snap: speeds to powers of sqrt 2, bandwidths to powers of 2). In the virtual mode (one process for
    `workers` simulated ranks) nothing can be measured: 'measured' means equal ranks and PipeDream's default 1e9 B/s
    links. -> (the hardware, the raw measurements before snapping, for partition.json)."""
    virtual = comm.world_size == 1
    raw: dict[str, Any] = {}
    if speeds == "measured":
        rank_speeds = (1.0,) * workers if virtual else measure_speeds(comm, model, example)
        raw["rank_speeds"] = rank_speeds
        rank_speeds = tuple(snap(v, SPEED_STEP) for v in rank_speeds)
    else:
        rank_speeds = tuple(float(s) for s in speeds)
    if bandwidth == "measured":
        links = Hardware.uniform(workers).bandwidth if virtual else measure_bandwidth(comm)
        raw["bandwidth"] = links
        links = tuple(tuple(snap(v, BANDWIDTH_STEP) for v in row) for row in links)
    elif isinstance(bandwidth, (int, float)):
        links = Hardware.uniform(workers, float(bandwidth)).bandwidth
    else:
        links = tuple(tuple(float(v) for v in row) for row in bandwidth)
    if len(rank_speeds) != workers or len(links) != workers:
        raise ValueError(f"rank_speeds and bandwidth must give one entry per rank ({workers})")
    return Hardware(rank_speeds, links), raw
