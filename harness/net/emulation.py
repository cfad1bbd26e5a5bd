"""Network emulation for local runs: one network namespace per rank, links shaped by tc tbf, latency by a relay.

Topology (built by `emulated_network`, removed when it exits, whatever happens):

    root namespace             hub namespace "dtb-<pid>-<n>-hub"            rank namespaces "dtb-<pid>-<n>-r<k>"
    dtb<pid>n<n> 10.213.T.1  <-veth->  uplink --- br0 --- r<k>  <-veth->  dtbnet 10.213.T.(10+k)

Every rank's link (r<k> <-> dtbnet) carries a tbf qdisc at the given rate on both ends, so each rank sends and
receives at most that rate (full duplex). The launcher's rendezvous store listens in the root namespace and is reached
at 10.213.T.1 (T: the first free 10.213.T.0/24). With a latency, the rank links are pairs of TUN devices instead of
veths: a relay thread copies the packets between them, each after latency/2, and the hub routes between the links
instead of bridging. A packet from one rank to another crosses two links, so `latency` is the one-way delay between
two ranks (the round trip is twice it); the store is latency/2 away. Ranks enter their namespace with `enter` before
they open any socket and talk over the interface IFNAME (GLOO_SOCKET_IFNAME).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.net.namespaces import NETNS_DIR, NetworkError, free_subnet, root_links, run_ip, sweep_stale
from harness.net.relay import Relay, open_tun_in
from harness.net.spec import NetworkSpec

#: The interface every rank talks over, inside its namespace.
IFNAME = "dtbnet"
LOCK_FILE = Path("/run/lock/dtbench-network.lock")
#: MTU of the relay's TUN links: large packets keep the Python relay's packet rate low.
TUN_MTU = 65000
#: tbf queue limit: packets wait at most this long for tokens before they are dropped (TCP backs off).
TBF_QUEUE = "50ms"

_counter = itertools.count()


def requirements_problem(spec: NetworkSpec) -> str | None:
    """Why the emulated network cannot be built here (one line saying what is needed), or None when it can."""
    if os.geteuid() != 0:
        return ("network emulation needs root (it creates network namespaces, veth links and tc qdiscs): "
                "run dtbench as root, or run without --network / [network]")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return (f"network emulation needs iproute2 ({' and '.join(missing)} not found on PATH): "
                f"install it (apt-get install iproute2), or run without --network / [network]")
    if spec.latency_s > 0 and not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "network emulation with a latency needs /dev/net/tun (the TUN driver) for its relay"
    return None



@dataclass
class Topology:
    """A built network: where each rank lives and where the launcher's store is reached."""

    spec: NetworkSpec
    world_size: int
    prefix: str
    hub: str
    subnet: str
    root_link: str
    ranks: list[str] = field(default_factory=list)
    relay: Relay | None = None

    @property
    def store_addr(self) -> str:
        """The root namespace's address on the emulated network: the rendezvous store listens here."""
        return f"{self.subnet}.1"

    def rank_addr(self, rank: int) -> str:
        return f"{self.subnet}.{10 + rank}"

    def describe(self) -> dict:
        """What manifest.json records about the network."""
        return {**self.spec.model_dump(), "rate_bps": self.spec.rate_bps, "latency_s": self.spec.latency_s,
                "interface": IFNAME, "namespaces": list(self.ranks), "store_addr": self.store_addr,
                "rank_addrs": [self.rank_addr(r) for r in range(self.world_size)],
                "shaping": "tc tbf on both ends of each rank link" if self.spec.rate_bps else "none",
                "latency_by": "userspace TUN relay (latency/2 per link and direction)" if self.spec.latency_s else None}


def tbf_args(rate_bps: int, mtu: int = 1500) -> list[str]:
    """tc arguments of the tbf qdisc that holds a link to `rate_bps`: a burst of 1 ms of traffic, at least 96 KiB
    and two packets, and a queue of TBF_QUEUE.

    The 96 KiB floor keeps a whole 64 KiB GSO packet within one burst. With 32 KiB, tbf had to split them, and a
    10 MiB all_reduce at 300 Mbit took 1.24x to 1.5x the ring model (1.04x with the floor; 100 Mbit: 1.10x -> 1.05x).
    """
    burst = max(96 * 1024, rate_bps // 8 // 1000, 2 * mtu)
    return ["tbf", "rate", f"{rate_bps}bit", "burst", str(burst), "latency", TBF_QUEUE]


def _shape(netns: str, device: str, spec: NetworkSpec, mtu: int) -> None:
    if spec.rate_bps is not None:
        run_ip("tc", "-n", netns, "qdisc", "add", "dev", device, "root", *tbf_args(spec.rate_bps, mtu))


def _build(topo: Topology) -> None:
    spec, hub = topo.spec, topo.hub
    run_ip("ip", "netns", "add", hub)
    for name in topo.ranks:
        run_ip("ip", "netns", "add", name)
    run_ip("ip", "link", "add", topo.root_link, "type", "veth", "peer", "name", "uplink", "netns", hub)
    run_ip("ip", "-n", hub, "link", "set", "lo", "up")
    if spec.latency_s == 0:
        run_ip("ip", "addr", "add", f"{topo.store_addr}/24", "dev", topo.root_link)
        run_ip("ip", "link", "set", topo.root_link, "up")
        run_ip("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        run_ip("ip", "-n", hub, "link", "set", "br0", "up")
        run_ip("ip", "-n", hub, "link", "set", "uplink", "master", "br0", "up")
        for rank, name in enumerate(topo.ranks):
            run_ip("ip", "-n", hub, "link", "add", f"r{rank}", "type", "veth", "peer", "name", IFNAME, "netns", name)
            run_ip("ip", "-n", hub, "link", "set", f"r{rank}", "master", "br0", "up")
            _rank_side(topo, rank, 1500)
            _shape(hub, f"r{rank}", spec, 1500)
        return
    # Latency: TUN pairs through the relay; the hub routes between them and the uplink.
    run_ip("ip", "addr", "add", f"{topo.store_addr}/32", "dev", topo.root_link)
    run_ip("ip", "link", "set", topo.root_link, "up")
    run_ip("ip", "route", "add", f"{topo.subnet}.0/24", "via", f"{topo.subnet}.2", "dev", topo.root_link, "onlink")
    run_ip("ip", "-n", hub, "addr", "add", f"{topo.subnet}.2/32", "dev", "uplink")
    run_ip("ip", "-n", hub, "link", "set", "uplink", "up")
    run_ip("ip", "-n", hub, "route", "add", f"{topo.store_addr}/32", "dev", "uplink")
    run_ip("ip", "netns", "exec", hub, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
    fds: list[int] = []  # rank end, hub end, rank end, hub end, ...
    try:
        for rank, name in enumerate(topo.ranks):
            fds.append(open_tun_in(name, IFNAME))
            fds.append(open_tun_in(hub, f"r{rank}"))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    topo.relay = Relay(list(zip(fds[::2], fds[1::2], strict=True)), spec.latency_s / 2).start()
    for rank, _name in enumerate(topo.ranks):
        run_ip("ip", "-n", hub, "link", "set", f"r{rank}", "mtu", str(TUN_MTU), "up")
        run_ip("ip", "-n", hub, "route", "add", f"{topo.rank_addr(rank)}/32", "dev", f"r{rank}")
        _rank_side(topo, rank, TUN_MTU)
        _shape(hub, f"r{rank}", spec, TUN_MTU)


def _rank_side(topo: Topology, rank: int, mtu: int) -> None:
    name = topo.ranks[rank]
    run_ip("ip", "-n", name, "link", "set", "lo", "up")
    run_ip("ip", "-n", name, "addr", "add", f"{topo.rank_addr(rank)}/24", "dev", IFNAME)
    run_ip("ip", "-n", name, "link", "set", IFNAME, "mtu", str(mtu), "up")
    _shape(name, IFNAME, topo.spec, mtu)


def teardown(topo: Topology) -> None:
    """Stop the relay and delete the namespaces and the root link (deleting a namespace deletes its links)."""
    if topo.relay is not None:
        topo.relay.stop()
        topo.relay = None
    for name in [*topo.ranks, topo.hub]:
        if (NETNS_DIR / name).exists():
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
    if topo.root_link in root_links():
        subprocess.run(["ip", "link", "delete", topo.root_link], capture_output=True, timeout=30)


@contextlib.contextmanager
def emulated_network(spec: NetworkSpec, world_size: int) -> Iterator[Topology]:
    """Build the emulated network for `world_size` ranks; tear it down on exit (also on errors and Ctrl-C).

    Leftovers of dead launchers are swept first. Raises NetworkError (one line) when something cannot be built.
    """
    problem = requirements_problem(spec)
    if problem:
        raise NetworkError(problem)
    pid, n = os.getpid(), next(_counter)
    prefix = f"dtb-{pid}-{n}"
    topo = Topology(spec=spec, world_size=world_size, prefix=prefix, hub=f"{prefix}-hub", subnet="",
                    root_link=f"dtb{pid}n{n}", ranks=[f"{prefix}-r{k}" for k in range(world_size)])
    try:
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one launcher at a time picks a subnet and claims it
            sweep_stale()
            topo.subnet = free_subnet()
            _build(topo)
        yield topo
    finally:
        teardown(topo)
