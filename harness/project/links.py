"""The alpha-beta model of a link and of the collectives over it (ring all-reduce, all-gather, broadcast, P2P)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.comm.ring import ring_all_reduce_bytes
from harness.net.spec import NetworkSpec, parse_network

#: Payload share of a shaped Ethernet link under TCP: 1448 payload bytes (MTU 1500 less 20 IP, 20 TCP and 12 bytes
#: of timestamp options) per 1514-byte frame as tc counts it (14 bytes of Ethernet header). docs/network.md measured
#: 95.7% of the rate as payload on this machine's veths.
WIRE_EFFICIENCY = 1448 / 1514
#: What an unshaped link between two ranks on one host carries (`dtbench net-check --network unlimited`: a 10 MiB
#: gloo all_reduce of 2 ranks in about 14 ms, docs/network.md), in bit/s: the default for `unlimited` and loopback.
UNSHAPED_RATE_BPS = 6e9


@dataclass(frozen=True)
class Link:
    """Every rank's link to the others: `bandwidth` payload bytes per second in each direction (full duplex),
    `alpha_s` seconds of latency per message, and `burst_bytes`, the payload a token bucket lets through at once after
    an idle spell (tc tbf's burst in the emulation; 0 for a plain link). `name` is the network as --network names it
    ('' for loopback)."""

    name: str
    bandwidth: float
    alpha_s: float = 0.0
    burst_bytes: float = 0.0

    def transfer_s(self, nbytes: float) -> float:
        """Seconds a message of nbytes occupies the link: nbytes / B."""
        return nbytes / self.bandwidth


def link_of(network: str, latency_s: float = 0.0, unshaped_rate_bps: float = UNSHAPED_RATE_BPS,
            efficiency: float = WIRE_EFFICIENCY, emulated: bool = False) -> Link:
    """A --network text ('100mbit', '1gbit,latency=1ms', 'unlimited', '' for loopback) -> its Link.

    B = rate · efficiency / 8 bytes/s for a shaped rate; unshaped_rate_bps / 8 for 'unlimited' and loopback (its
    measured rate already is payload). alpha = the network's own latency when it names one, else `latency_s`.
    With `emulated`, a shaped link also gets the emulation's tbf burst (times the efficiency, in payload bytes):
    what the runs of this harness had, as against a switch port that holds its rate from the first byte.
    Raises ValueError (one line) on a bad network text.
    """
    spec: NetworkSpec | None = parse_network(network) if network else None
    burst = 0.0
    if spec is None or spec.rate_bps is None:
        bandwidth = unshaped_rate_bps / 8
    else:
        bandwidth = spec.rate_bps * efficiency / 8
        if emulated:  # tbf's burst as the emulation sets it (harness/net/emulation.py), in bytes on the wire
            from harness.net.emulation import tbf_args

            args = tbf_args(spec.rate_bps)
            burst = float(args[args.index("burst") + 1]) * efficiency
    alpha = spec.latency_s if spec is not None and spec.latency else latency_s
    return Link(network, bandwidth, alpha, burst)


class TokenBucket:
    """One direction of a shaped link as tc tbf holds it, in payload bytes: up to `burst_bytes` tokens, refilled at
    the bandwidth; a message passes at once as far as tokens last, the rest at the bandwidth."""

    def __init__(self, link: Link):
        self.link = link
        self.tokens = link.burst_bytes
        self.at = 0.0

    def available(self, time: float) -> float:
        """Tokens at `time` (no earlier than the last use)."""
        return min(self.link.burst_bytes, self.tokens + max(0.0, time - self.at) * self.link.bandwidth)

    def use(self, time: float, credit: float, end: float) -> None:
        """`credit` tokens spent by a transfer from `time` to `end`."""
        self.tokens, self.at = self.available(time) - credit, max(time, end)


def shaped_seconds(volume: float, start: float, buckets: list[TokenBucket]) -> float:
    """Seconds `volume` payload bytes occupy links whose buckets are `buckets` (the sender's egress and the
    receiver's ingress), starting at `start`: (volume - min tokens available) / B, at least 0; spends the tokens."""
    link = buckets[0].link
    credit = min([volume] + [b.available(start) for b in buckets])
    seconds = (volume - credit) / link.bandwidth
    for bucket in buckets:
        bucket.use(start, credit, start + seconds)
    return seconds


def ring_volume(kind: str, nbytes: float, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a collective: 2(N-1)/N·n for a ring all-reduce, (N-1)·n for a ring
    all-gather and for the root of a broadcast; 0 for one rank."""
    if world_size <= 1:
        return 0.0
    if kind == "all_reduce":
        return ring_all_reduce_bytes(float(nbytes), world_size)
    return {"all_gather": world_size - 1, "broadcast": world_size - 1}[kind] * nbytes


def collective_s(kind: str, nbytes: float, world_size: int, link: Link) -> float:
    """The time of a collective named as train records name it (zero for one rank):
    - 'all_reduce': reduce-scatter then all-gather, 2(N-1) rounds of n/N bytes each way (Patarasuk and Yuan 2009):
      2(N-1)/N · n/B + 2(N-1)·alpha;
    - 'all_gather': n bytes from each of N ranks, N-1 rounds of n bytes each way: (N-1)·n/B + (N-1)·alpha;
    - 'broadcast': a root that sends to each other rank in turn (the byte count of docs/results.md: the root sends
      (N-1)·n): (N-1)·n/B + alpha."""
    n = world_size - 1
    formulas = {"all_reduce": lambda: ring_volume(kind, nbytes, world_size) / link.bandwidth + 2 * n * link.alpha_s,
                "all_gather": lambda: n * (link.transfer_s(nbytes) + link.alpha_s),
                "broadcast": lambda: n * link.transfer_s(nbytes) + link.alpha_s}
    if kind not in formulas:
        raise ValueError(f"unknown collective {kind!r} (known: {', '.join(formulas)})")
    return formulas[kind]() if world_size > 1 else 0.0
