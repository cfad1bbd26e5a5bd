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
import ctypes
import fcntl
import heapq
import itertools
import os
import re
import selectors
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

#: The interface every rank talks over, inside its namespace.
IFNAME = "dtbnet"
NETNS_DIR = Path("/var/run/netns")
LOCK_FILE = Path("/run/lock/dtbench-network.lock")
#: Namespaces and root links of this module carry the launcher's pid, so that a sweep can find leftovers.
NETNS_PATTERN = re.compile(r"^dtb-(\d+)-\d+-")
ROOT_LINK_PATTERN = re.compile(r"^dtb(\d+)n\d+$")
#: MTU of the relay's TUN links: large packets keep the Python relay's packet rate low.
TUN_MTU = 65000
#: tbf queue limit: packets wait at most this long for tokens before they are dropped (TCP backs off).
TBF_QUEUE = "50ms"

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_TIME = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_counter = itertools.count()


class NetworkError(Exception):
    """The emulated network could not be built or is not available here. The message is one line."""


def parse_rate(text: str) -> int | None:
    """'100mbit' -> 100_000_000 bit/s (tc's units: bit, kbit, mbit, gbit; powers of 1000); 'unlimited' -> None."""
    value = text.strip().lower()
    if value == "unlimited":
        return None
    match = _RATE.match(value)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"rate {text!r}: give a positive number with a unit bit, kbit, mbit or gbit "
                         f"(e.g. 100mbit, 1gbit), or 'unlimited'")
    return round(float(match.group(1)) * _RATE_UNITS[match.group(2)])


def parse_latency(text: str) -> float:
    """'1ms' -> 0.001 s (units us, ms, s); '0' or '0ms' -> 0."""
    value = text.strip().lower()
    if value == "0":
        return 0.0
    match = _TIME.match(value)
    if not match:
        raise ValueError(f"latency {text!r}: give a number with a unit us, ms or s (e.g. 1ms, 500us)")
    return float(match.group(1)) * _TIME_UNITS[match.group(2)]


class NetworkSpec(BaseModel):
    """An emulated network: every rank's link limited to `rate` in each direction, and `latency` one way between
    two ranks. Written to spec.json and manifest.json; `text` is its short form (the --network syntax)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: str = "unlimited"
    latency: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: object) -> object:
        """Accept the short form too: '100mbit,latency=1ms' (a suite's `network = "..."`)."""
        return _text_fields(data) if isinstance(data, str) else data

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        parse_rate(value)
        return value.strip().lower()

    @field_validator("latency")
    @classmethod
    def _latency(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return None if parse_latency(value) == 0 else value.strip().lower()

    @property
    def rate_bps(self) -> int | None:
        """Bits per second of each link in each direction; None when unlimited."""
        return parse_rate(self.rate)

    @property
    def latency_s(self) -> float:
        """One-way delay between two ranks in seconds (0 without a latency)."""
        return parse_latency(self.latency) if self.latency else 0.0

    @property
    def text(self) -> str:
        """'100mbit' or '100mbit,latency=1ms': the --network form, which `parse_network` reads back."""
        return self.rate + (f",latency={self.latency}" if self.latency else "")


def _text_fields(text: str) -> dict[str, str]:
    """'100mbit,latency=1ms' -> {'rate': '100mbit', 'latency': '1ms'}; ValueError on an unknown option."""
    rate, *options = [part.strip() for part in text.split(",")]
    fields: dict[str, str] = {"rate": rate}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key.strip() != "latency":
            raise ValueError(f"network {text!r}: unknown option {option!r} (the form is RATE[,latency=TIME], "
                             f"e.g. 100mbit,latency=1ms)")
        fields["latency"] = value.strip()
    return fields


def parse_network(text: str) -> NetworkSpec:
    """The --network form -> NetworkSpec: 'RATE[,latency=TIME]', e.g. '1gbit', 'unlimited', '100mbit,latency=1ms'.

    Raises ValueError with one line saying what is wrong.
    """
    fields = _text_fields(text)
    try:
        parse_rate(fields["rate"])
        if "latency" in fields:
            parse_latency(fields["latency"])
    except ValueError as exc:
        raise ValueError(f"network {text!r}: {exc}") from None
    return NetworkSpec(**fields)


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


# -------------------------------------------------------------------------------------------- namespaces

_CLONE_NEWNET = 0x40000000


def enter(netns: str) -> None:
    """Move the calling thread into the named network namespace (as `ip netns exec` does). Call it before any socket
    is opened and before any thread is started: threads started later inherit it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {netns}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _run(*command: str) -> str:
    """Run an iproute2 command; a failure raises NetworkError naming the command and its error."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise NetworkError(f"network setup failed: `{' '.join(command)}`: {message[0] if message else done.returncode}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_netns() -> list[str]:
    """The names of the named network namespaces (those `ip netns` lists)."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except OSError:
        return []


def _root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def sweep_stale() -> list[str]:
    """Remove the namespaces and root links that a dtbench launcher which no longer runs left behind (it was
    killed with SIGKILL, say). Returns what was removed."""
    removed = []
    for name in list_netns():
        match = NETNS_PATTERN.match(name)
        if match and not _alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
            removed.append(name)
    for link in _root_links():
        match = ROOT_LINK_PATTERN.match(link)
        if match and not _alive(int(match.group(1))):
            subprocess.run(["ip", "link", "delete", link], capture_output=True, timeout=30)
            removed.append(link)
    return removed


def _free_subnet() -> str:
    """A 10.213.T.0/24 that no route or address of the root namespace overlaps: '10.213.T'."""
    used = _run("ip", "-4", "-o", "route", "show") + _run("ip", "-4", "-o", "addr", "show")
    for third in range(256):
        prefix = f"10.213.{third}"
        if f"{prefix}." not in used:
            return prefix
    raise NetworkError("network setup failed: no free 10.213.T.0/24 subnet left (remove stale dtb links)")


# -------------------------------------------------------------------------------------------------- relay

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000


def _open_tun_in(netns: str, name: str) -> int:
    """Create TUN device `name` inside `netns` and return its (non-blocking) file descriptor.

    The device is created from a helper thread that has entered the namespace, so the launcher's own threads
    never leave the root namespace. It disappears when the descriptor is closed.
    """
    result: dict[str, int | BaseException] = {}

    def create() -> None:
        try:
            enter(netns)
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
            result["fd"] = fd
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result["error"] = exc

    thread = threading.Thread(target=create, name=f"tun-{netns}")
    thread.start()
    thread.join()
    if "error" in result:
        raise NetworkError(f"network setup failed: TUN device {name} in {netns}: {result['error']}")
    return int(result["fd"])


class Relay:
    """Copies packets between pairs of TUN file descriptors, each one `delay_s` after it was read.

    One thread, one selector and a heap of (due time, packet). A packet read from one end of a pair is written to
    the other end once due, in order within a direction; it is dropped only when the device refuses it.
    """

    def __init__(self, pairs: list[tuple[int, int]], delay_s: float):
        self.delay_s = delay_s
        self.peer = {a: b for a, b in pairs} | {b: a for a, b in pairs}
        self.packets = 0
        self.dropped = 0
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="dtbench-relay", daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        return self

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        for fd in self.peer:
            selector.register(fd, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        queue: list[tuple[float, int, int, bytes]] = []
        order = itertools.count()
        while not self._stop:
            timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
            for key, _ in selector.select(timeout):
                if key.fd == self._wake_r:
                    continue
                due = time.monotonic() + self.delay_s
                while True:
                    try:
                        packet = os.read(key.fd, 65536)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:  # the device is down or went away (teardown): nothing to read
                        break
                    heapq.heappush(queue, (due, next(order), self.peer[key.fd], packet))
            now = time.monotonic()
            while queue and queue[0][0] <= now:
                _, _, out, packet = heapq.heappop(queue)
                try:
                    os.write(out, packet)
                    self.packets += 1
                except OSError:
                    self.dropped += 1  # the device is down or its queue is full: a drop, as on a real link
        selector.close()

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        for fd in (*self.peer, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


# --------------------------------------------------------------------------------------------------- topology


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
        _run("tc", "-n", netns, "qdisc", "add", "dev", device, "root", *tbf_args(spec.rate_bps, mtu))


def _build(topo: Topology) -> None:
    spec, hub = topo.spec, topo.hub
    _run("ip", "netns", "add", hub)
    for name in topo.ranks:
        _run("ip", "netns", "add", name)
    _run("ip", "link", "add", topo.root_link, "type", "veth", "peer", "name", "uplink", "netns", hub)
    _run("ip", "-n", hub, "link", "set", "lo", "up")
    if spec.latency_s == 0:
        _run("ip", "addr", "add", f"{topo.store_addr}/24", "dev", topo.root_link)
        _run("ip", "link", "set", topo.root_link, "up")
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        _run("ip", "-n", hub, "link", "set", "uplink", "master", "br0", "up")
        for rank, name in enumerate(topo.ranks):
            _run("ip", "-n", hub, "link", "add", f"r{rank}", "type", "veth", "peer", "name", IFNAME, "netns", name)
            _run("ip", "-n", hub, "link", "set", f"r{rank}", "master", "br0", "up")
            _rank_side(topo, rank, 1500)
            _shape(hub, f"r{rank}", spec, 1500)
        return
    # Latency: TUN pairs through the relay; the hub routes between them and the uplink.
    _run("ip", "addr", "add", f"{topo.store_addr}/32", "dev", topo.root_link)
    _run("ip", "link", "set", topo.root_link, "up")
    _run("ip", "route", "add", f"{topo.subnet}.0/24", "via", f"{topo.subnet}.2", "dev", topo.root_link, "onlink")
    _run("ip", "-n", hub, "addr", "add", f"{topo.subnet}.2/32", "dev", "uplink")
    _run("ip", "-n", hub, "link", "set", "uplink", "up")
    _run("ip", "-n", hub, "route", "add", f"{topo.store_addr}/32", "dev", "uplink")
    _run("ip", "netns", "exec", hub, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
    fds: list[int] = []  # rank end, hub end, rank end, hub end, ...
    try:
        for rank, name in enumerate(topo.ranks):
            fds.append(_open_tun_in(name, IFNAME))
            fds.append(_open_tun_in(hub, f"r{rank}"))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    topo.relay = Relay(list(zip(fds[::2], fds[1::2], strict=True)), spec.latency_s / 2).start()
    for rank, _name in enumerate(topo.ranks):
        _run("ip", "-n", hub, "link", "set", f"r{rank}", "mtu", str(TUN_MTU), "up")
        _run("ip", "-n", hub, "route", "add", f"{topo.rank_addr(rank)}/32", "dev", f"r{rank}")
        _rank_side(topo, rank, TUN_MTU)
        _shape(hub, f"r{rank}", spec, TUN_MTU)


def _rank_side(topo: Topology, rank: int, mtu: int) -> None:
    name = topo.ranks[rank]
    _run("ip", "-n", name, "link", "set", "lo", "up")
    _run("ip", "-n", name, "addr", "add", f"{topo.rank_addr(rank)}/24", "dev", IFNAME)
    _run("ip", "-n", name, "link", "set", IFNAME, "mtu", str(mtu), "up")
    _shape(name, IFNAME, topo.spec, mtu)


def teardown(topo: Topology) -> None:
    """Stop the relay and delete the namespaces and the root link (deleting a namespace deletes its links)."""
    if topo.relay is not None:
        topo.relay.stop()
        topo.relay = None
    for name in [*topo.ranks, topo.hub]:
        if (NETNS_DIR / name).exists():
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
    if topo.root_link in _root_links():
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
            topo.subnet = _free_subnet()
            _build(topo)
        yield topo
    finally:
        teardown(topo)
