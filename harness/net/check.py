"""`dtbench net-check`: an emulated network's point-to-point bandwidth and ring all_reduce time against the model."""

from __future__ import annotations

import multiprocessing
import os
import queue
import statistics
import time
import traceback
from dataclasses import dataclass

from harness.comm.ring import ring_all_reduce_time
from harness.net.emulation import IFNAME, emulated_network
from harness.net.namespaces import enter
from harness.net.spec import NetworkSpec

#: Default payload of both probes (bytes): 10 MiB, as in the issue's calibration.
DEFAULT_BYTES = 10 * 2**20
DEFAULT_TOLERANCE = 0.25


def ring_all_reduce_seconds(size_bytes: int, world_size: int, rate_bps: int | None, latency_s: float = 0.0) -> float:
    """What a ring all-reduce of `size_bytes` takes when every rank's link carries `rate_bps` each way and a message
    takes `latency_s` one way: 2(W-1) steps, each moving size/W bytes, so 2(W-1)/W·size/B + 2(W-1)·latency.
    NaN when the rate is unlimited (the model then says nothing); 0 for one rank."""
    if world_size < 2:
        return 0.0
    if rate_bps is None:
        return float("nan")
    return ring_all_reduce_time(size_bytes, world_size, rate_bps / 8, latency_s)


def point_to_point_seconds(size_bytes: int, rate_bps: int | None, latency_s: float = 0.0) -> float:
    """What sending `size_bytes` from one rank to another and getting a one-element acknowledgement back takes:
    size/B + 2·latency. NaN when the rate is unlimited."""
    if rate_bps is None:
        return float("nan")
    return size_bytes * 8 / rate_bps + 2 * latency_s


@dataclass
class Check:
    """One probe: measured against the model (seconds), and whether it is within the tolerance."""

    name: str
    size_bytes: int
    measured_s: float
    model_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.model_s if self.model_s and self.model_s == self.model_s else float("nan")

    def within(self, tolerance: float) -> bool:
        """True when measured is within `tolerance` (relative) of the model, or when there is no model."""
        return self.ratio != self.ratio or abs(self.ratio - 1) <= tolerance


def _probe(rank: int, world_size: int, netns: str, store_addr: str, port: int, size_bytes: int, repeats: int,
           out: multiprocessing.Queue) -> None:
    """One rank of the measurement, inside its namespace: p2p 0 -> 1 with an ack, then a ring all_reduce."""
    try:
        enter(netns)
        os.environ["GLOO_SOCKET_IFNAME"] = IFNAME
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        store = dist.TCPStore(store_addr, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        payload = torch.ones(size_bytes // 4)
        ack = torch.zeros(1)
        p2p, reduce = [], []
        for attempt in range(repeats + 1):  # the first of each is a warm-up (connections, buffers)
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(payload, 1)
                dist.recv(ack, 1)
            elif rank == 1:
                dist.recv(payload, 0)
                dist.send(ack, 0)
            if attempt:
                p2p.append(time.perf_counter() - start)
        for attempt in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(payload)
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the collective ends when its slowest rank does
            if attempt:
                reduce.append(float(elapsed))
        dist.destroy_process_group()
        out.put((rank, {"p2p": p2p, "all_reduce": reduce}, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put((rank, None, traceback.format_exc()))


def measure(spec: NetworkSpec, world_size: int = 2, size_bytes: int = DEFAULT_BYTES, repeats: int = 3,
            timeout_s: float = 300.0) -> list[Check]:
    """Build the emulated network for `world_size` ranks, run the probes, tear it down; the medians as Checks.

    Raises NetworkError when the network cannot be built, RuntimeError when a probe rank fails.
    """
    from harness.net.listen import hosted_store

    if world_size < 2:
        raise ValueError("net-check needs at least 2 ranks")
    with emulated_network(spec, world_size) as topo:
        store = hosted_store(topo.store_addr, world_size)  # on the ranks' network only
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_probe, args=(r, world_size, topo.ranks[r], topo.store_addr, store.port,
                                                  size_bytes, repeats, out), name=f"probe{r}")
                 for r in range(world_size)]
        for p in procs:
            p.start()
        results = {}
        try:
            for _ in range(world_size):
                rank, value, error = out.get(timeout=timeout_s)
                if error:
                    raise RuntimeError(f"net-check rank {rank} failed:\n{error}")
                results[rank] = value
        except queue.Empty:
            raise RuntimeError(f"net-check: the probes did not finish within {timeout_s:.0f} s") from None
        finally:
            for p in procs:
                p.join(5)
                if p.exitcode is None:
                    p.kill()
                    p.join(5)
            del store
    rate, latency = spec.rate_bps, spec.latency_s
    return [
        Check("point-to-point 0->1 (+ack)", size_bytes, statistics.median(results[0]["p2p"]),
              point_to_point_seconds(size_bytes, rate, latency)),
        Check(f"ring all_reduce x{world_size}", size_bytes, statistics.median(results[0]["all_reduce"]),
              ring_all_reduce_seconds(size_bytes, world_size, rate, latency)),
    ]


def format_table(spec: NetworkSpec, checks: list[Check], tolerance: float) -> str:
    """The checks as a small text table, with the achieved bandwidth of each probe's bytes."""

    def ms(seconds: float) -> str:
        return "-" if seconds != seconds else f"{seconds * 1e3:.1f}"

    lines = [f"network {spec.text} (tolerance {tolerance:.0%})",
             f"{'probe':<28} {'MiB':>6} {'measured ms':>12} {'model ms':>9} {'ratio':>6} {'Mbit/s':>8}  verdict"]
    for check in checks:
        factor = 1.0 if check.name.startswith("point") else 2 * (1 - 1 / int(check.name.rsplit("x", 1)[1]))
        achieved = check.size_bytes * 8 * factor / check.measured_s / 1e6
        ratio = "-" if check.ratio != check.ratio else f"{check.ratio:.2f}"
        verdict = "no model" if check.ratio != check.ratio else ("ok" if check.within(tolerance) else "OFF")
        lines.append(f"{check.name:<28} {check.size_bytes / 2**20:>6.1f} {ms(check.measured_s):>12} "
                     f"{ms(check.model_s):>9} {ratio:>6} {achieved:>8.1f}  {verdict}")
    return "\n".join(lines)
