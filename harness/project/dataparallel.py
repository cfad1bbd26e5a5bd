"""Data-parallel steps: DDP's gradient buckets and their overlap with the backward, compression's compute and
payload, and the collective each bucket costs on a link."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from harness.project.links import Link, TokenBucket, collective_s, ring_volume, shaped_seconds

#: DDP's bucket caps (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES and bucket_cap_mb=25).
FIRST_BUCKET_BYTES = 1024 * 1024
BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class Bucket:
    """One DDP bucket: `nbytes` of fp32 gradients, ready when the backward of block `ready_block` ends (the lowest
    block holding one of its parameters: gradients arrive from the last block to the first)."""

    nbytes: int
    ready_block: int


def ddp_buckets(param_bytes: Sequence[Sequence[int]], first_cap: int = FIRST_BUCKET_BYTES,
                cap: int = BUCKET_BYTES) -> list[Bucket]:
    """The buckets DDP reduces from its second step on, in the order they become ready.

    param_bytes[block] lists the bytes of that block's parameters in registration order. From the second step DDP
    rebuilds its buckets in the order gradients became ready: the blocks from last to first, each block's
    parameters in reverse registration order (a Linear's bias before its weight). A bucket takes parameters until
    its size reaches its cap: first_cap for the first bucket, cap for the others (torch's
    compute_bucket_assignment_by_size; checked against torch 2.14 in tests/projection/test_project_formulas.py).
    """
    buckets: list[Bucket] = []
    size, lowest, limit = 0, -1, first_cap
    for block in reversed(range(len(param_bytes))):
        for nbytes in reversed(param_bytes[block]):
            size, lowest = size + int(nbytes), block
            if size >= limit:
                buckets.append(Bucket(size, lowest))
                size, limit = 0, cap
    if size:
        buckets.append(Bucket(size, lowest))
    return buckets


@dataclass(frozen=True)
class DataParallelCosts:
    """What one rank spends on a data-parallel step, at its per-rank batch.

    forward_s, backward_s: per block (blocks x 1); optimizer_s: the update; buckets: ddp_buckets of the model;
    compress_s: compression compute per step (all buckets), on the backward's thread; decompress_s: decoding per
    step at this world size, after each bucket's collective; payload_ratio: payload bytes / fp32 gradient bytes
    (1 for plain ddp); collective: 'all_reduce' (payloads that sum) or 'all_gather'.
    """

    forward_s: Sequence[float]
    backward_s: Sequence[float]
    optimizer_s: float
    buckets: Sequence[Bucket]
    compress_s: float = 0.0
    decompress_s: float = 0.0
    payload_ratio: float = 1.0
    collective: str = "all_reduce"

    @property
    def compute_s(self) -> float:
        """Forward, backward and update: sum(forward_s) + sum(backward_s) + optimizer_s."""
        return sum(self.forward_s) + sum(self.backward_s) + self.optimizer_s

    def scaled(self, factor: float) -> DataParallelCosts:
        """The same step with forward, backward and update times multiplied by `factor` (compression kept)."""
        return replace(self, forward_s=[t * factor for t in self.forward_s],
                       backward_s=[t * factor for t in self.backward_s], optimizer_s=self.optimizer_s * factor)


@dataclass(frozen=True)
class StepParts:
    """A projected step: step_s = compute_s + compression_s + exposed_comm_s (+ bubble_s + other_s for pipelines).
    comm_s is the collectives' whole time (launch to arrival, summed), overlapped or not."""

    step_s: float
    compute_s: float
    compression_s: float = 0.0
    exposed_comm_s: float = 0.0
    bubble_s: float = 0.0
    other_s: float = 0.0
    comm_s: float = 0.0


def data_parallel_step(costs: DataParallelCosts, world_size: int, link: Link) -> StepParts:
    """One step of DDP (with or without a compression hook) on `world_size` ranks over `link`.

    t = sum(forward). Then the blocks' backwards run from last to first; when bucket k's last gradient is ready its
    hook compresses it on the backward's thread (t += compress_s · n_k/n), and launches its collective:
    start_k = max(t, free), end_k = start_k + T(payload_ratio · n_k) with T the ring collective (links.py), after
    which its payloads are decoded (decompress_s · n_k/n): free = end_k + that. The step ends when the backward and
    the last decode are done, plus the update: step = max(t_backward_end, free) + optimizer_s.
    Parts: compute = forward + backward + update; compression = compress_s + the decoding that runs after the
    backward ended; exposed communication = the rest. On a link with a burst (token bucket), a collective's time
    shrinks by the tokens available at its start (at most its volume) over B; the bucket carries over from step to
    step, and the third of three consecutive steps is returned (the steady state).
    """
    bucket = TokenBucket(link)
    offset = 0.0
    for _ in range(3):
        parts = one_step(costs, world_size, link, bucket, offset)
        offset += parts.step_s
    return parts


def one_step(costs: DataParallelCosts, world_size: int, link: Link, bucket: TokenBucket, offset: float
             ) -> StepParts:
    """data_parallel_step's timeline for one step starting at `offset` (the bucket's clock)."""
    total = sum(b.nbytes for b in costs.buckets) or 1
    t = sum(costs.forward_s)
    free, comm, decodes = 0.0, 0.0, []
    pending = list(costs.buckets)
    for block in reversed(range(len(costs.backward_s))):
        t += costs.backward_s[block]
        while pending and pending[0].ready_block >= block:
            nbytes = pending.pop(0).nbytes
            share = nbytes / total
            t += costs.compress_s * share
            start = max(t, free)
            payload = nbytes * costs.payload_ratio
            seconds = collective_s(costs.collective, payload, world_size, link)
            volume = ring_volume(costs.collective, payload, world_size)
            if link.burst_bytes and volume:  # the tokens pass at once: the wire time shrinks
                seconds += shaped_seconds(volume, offset + start, [bucket]) - volume / link.bandwidth
            end = start + seconds
            comm += end - t
            free = end + costs.decompress_s * share
            decodes.append((end, free))
    backward_end = t
    step = max(backward_end, free) + costs.optimizer_s
    exposed_decode = sum(max(0.0, stop - max(begin, backward_end)) for begin, stop in decodes)
    compression = costs.compress_s + exposed_decode
    return StepParts(step_s=step, compute_s=costs.compute_s, compression_s=compression,
                     exposed_comm_s=step - costs.compute_s - compression, comm_s=comm)

