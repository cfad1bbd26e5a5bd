"""The compressed DDP communication hook: compensate, compress, update memory, communicate, decompress, average."""

from __future__ import annotations

import time

import torch

from harness.comm.communicator import Communicator
from harness.memory.peak import thread
from methods.compression.core import Compressed, Compressor, Memory
from methods.compression.packing import from_wire, to_wire
from methods.compression.retire import Retired
from methods.compression.stats import CompressionStats


class CompressionHook:
    """A DDP communication hook over a compressor and a memory, with every byte through the Communicator.

    For each bucket: memory.prepare(the bucket's gradients); per parameter, g <- memory.compensate(g);
    c <- compressor.compress(g); memory.update(g, c).
    If the compressor's payloads sum (`sums`), they are concatenated in their own dtype and all-reduced, then
    decompressed once. Otherwise the bucket's payloads travel as one flat byte buffer, all-gathered (every rank's
    layout is the same, so no padding or size exchange is needed), and every rank decompresses every rank's
    payload. Either way the average is written into the bucket.

    A step's payloads, futures and callbacks are kept in `retired` until the method releases them on the main
    thread after its backward (methods/compression/retire.py: the CPU allocator's meter sees their frees there).
    """

    def __init__(self, comm: Communicator, compressor: Compressor, memory: Memory,
                 names: dict[torch.nn.Parameter, str], dense: set[str] | frozenset[str] = frozenset()):
        self.comm = comm
        self.compressor = compressor
        self.memory = memory
        self.names = names
        # Tensors are compressed in model order, whatever the bucket's own order: DDP's first buckets list
        # them in model order and its rebuilt ones (from the second step on) in reverse, and a stochastic
        # compressor's random draws must follow the same order at every step, so that a run resumed from a
        # checkpoint (whose first step has fresh buckets again) draws exactly as an uninterrupted one.
        self.position = {name: i for i, name in enumerate(names.values())}
        self.dense = dense  # parameter names sent as plain fp32, bypassing compressor and memory
        if compressor.sums and dense:
            raise ValueError("a compressor whose payloads sum is all-reduced in its own dtype: it cannot be mixed "
                             "with dense fp32 tensors (leave min_compress_numel at 0)")
        self.stats = CompressionStats()
        self.retired = Retired()  # a step's payloads, futures and callbacks, released on the main thread

    def _codec(self, name: str) -> Compressor:
        return _DENSE if name in self.dense else self.compressor

    def __call__(self, _state, bucket):  # no annotations: DDP checks them literally
        start = time.perf_counter()
        buffer = bucket.buffer()
        named, offset = [], 0
        params = bucket.parameters()
        for p in params:
            named.append((self.names[p], buffer[offset:offset + p.numel()], p))
            offset += p.numel()
        named.sort(key=lambda item: self.position[item[0]])
        compressed_part = [(n, g) for n, g, _ in named if n not in self.dense]
        self.retired.sent(*(self.compressor.prepare(compressed_part, self.comm) or ()))
        self.memory.prepare(compressed_part)
        items = []
        for name, grad, param in named:
            if name in self.dense:
                items.append(_DENSE.compress(grad, name))
                continue
            compensated = self.memory.compensate(grad, name, param)
            compressed = self.compressor.compress(compensated, name)
            self.memory.update(compensated, name, self.compressor, compressed)
            items.append(compressed)
        world = self.comm.world_size
        sizes = layout = None
        if self.compressor.sums:
            # Payloads that sum are all-reduced in their own dtype, concatenated: one collective per bucket.
            wire = torch.cat([t.reshape(-1) for item in items for t in item.payload])
            sizes = [t.numel() for item in items for t in item.payload]
            gathered = wire
        else:
            # Anything else travels as bytes, all-gathered (equal layouts on every rank: no size exchange).
            wire, layout = to_wire(items)
            gathered = torch.empty(world * wire.numel(), dtype=torch.uint8, device=wire.device)
        sent = time.perf_counter()
        self.stats.compress_s += sent - start
        self.stats.dense_bytes += buffer.numel() * 4
        self.stats.payload_bytes += wire.numel() * wire.element_size()
        # The callback reads its tensors from a bag held until the method releases it on the main thread after the
        # backward (retire.py), never from its closure: gloo's thread drops the callback and the collective's
        # references, where the allocator's meter cannot see a free.
        bag = self.retired.bag(wire=wire, gathered=gathered, items=items, named=named)
        if self.compressor.sums:
            fut = self.comm.all_reduce(wire, "gradients", async_op=True)
            self.retired.sent(wire)
        else:
            fut = self.comm.all_gather_into(gathered, wire, "gradients", async_op=True)
            self.retired.sent(wire, gathered)
        del wire, gathered, items, named

        def finish(f):
            arrived = time.perf_counter()
            self.stats.communicate_s += arrived - sent
            f.wait()  # re-raises a communication error here
            with thread():  # on gloo's worker thread: the decoding's bytes join the rank's allocator meter
                self._decode(bag, sizes, layout)
            self.stats.decompress_s += time.perf_counter() - arrived
            return buffer

        return fut.then(finish)

    def _decode(self, bag: dict, sizes: list[int] | None, layout: list | None) -> None:
        """Every rank's payloads (the summed wire cut by `sizes`, or the gathered rows cut by `layout`) decoded and
        averaged into the bucket's slices. Its temporaries die before it returns (inside the meter's scope)."""
        world, items, named = self.comm.world_size, bag["items"], bag["named"]
        if sizes is not None:
            parts = iter(bag["wire"].split(sizes))
            rows = [[[next(parts).view_as(t) for t in item.payload] for item in items]]
        else:
            rows = [from_wire(row, layout) for row in bag["gathered"].view(world, -1).unbind(0)]
        for i, (name, grad, _) in enumerate(named):
            # The compressed inputs are no longer needed: the bucket slice becomes the sum of decoded payloads.
            codec = self._codec(name)
            grad.zero_()
            for payload in rows:
                codec.decompress_add_(grad, payload[i], items[i].ctx)
            grad.div_(world)


class _Dense(Compressor):
    """Plain fp32: the tensor itself is the payload."""

    def compress(self, tensor: torch.Tensor, name: str) -> Compressed:
        return Compressed([tensor.detach().clone()])

    def decompress(self, payload: list[torch.Tensor], ctx) -> torch.Tensor:
        return payload[0]


_DENSE = _Dense()
