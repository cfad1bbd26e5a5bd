"""What ring collectives cost, without torch: each rank's wire bytes (the communicator's count) and the all-reduce's
alpha-beta time (net-check's model and the projection's links)."""

from __future__ import annotations


def ring_all_reduce_bytes(nbytes: int | float, world_size: int) -> int | float:
    """Bytes each rank sends (and receives) in a ring all-reduce of an `nbytes` tensor: reduce-scatter then
    all-gather, 2(W-1) rounds of n/W bytes each way (Patarasuk and Yuan 2009), so 2(W-1)/W * n; 0 for one rank.
    An int n gives whole bytes, rounded down (what the communicator counts); a float n, the exact float."""
    if world_size <= 1:
        return 0 * nbytes
    moved = 2 * (world_size - 1) * nbytes
    return moved // world_size if isinstance(nbytes, int) else moved / world_size


def ring_all_reduce_time(nbytes: float, world_size: int, bandwidth: float, alpha_s: float = 0.0) -> float:
    """Seconds a ring all-reduce of an `nbytes` tensor over `world_size` ranks takes when each rank's link carries
    `bandwidth` payload bytes per second each way and a message takes `alpha_s`: 2(W-1)/W * n/B + 2(W-1) * alpha.
    Zero for one rank."""
    if world_size <= 1:
        return 0.0
    return ring_all_reduce_bytes(float(nbytes), world_size) / bandwidth + 2 * (world_size - 1) * alpha_s


def ring_all_gather_bytes(nbytes: int, world_size: int) -> int:
    """Bytes each rank sends (and receives) in a ring all-gather of `nbytes` per rank: (W-1) * n."""
    return (world_size - 1) * nbytes
