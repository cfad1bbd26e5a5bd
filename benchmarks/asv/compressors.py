"""Gradient compressors: compress+decompress time and memory, payload size, and the ratio to a plain tensor copy.

Every compressor is measured the way the DDP hook runs it on one bucket: compress a flat fp32 gradient, zero the
output, decode into it (`decompress_add_`), on one thread. Its peer is `out.copy_(gradient)` into the same
preallocated output, the memory-bandwidth yardstick (benchmarks/measure/compressors.py has the same peer and a naive
port).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch  # at import: asv's forkserver then imports it once for every benchmark process

from ._timing import interleaved_ratio

SIZES = [1_000_000, 25_000_000]
COPY = "copy"
RATIO_ROUNDS, RATIO_MIN_SECONDS = 7, 0.05  # VersusCopy: alternating rounds, and the least seconds of each block


def _make(name: str):
    """A fresh compressor by benchmark name (imports are lazy: nothing of dtbench loads at discovery)."""
    if name == "qsgd-4bit":
        from methods.compression.qsgd import QSGDCompressor

        return QSGDCompressor(4, 512)  # QSGD's defaults at 4 bits: bucket d = 512
    if name == "terngrad":
        from methods.compression.terngrad import TernGradCompressor

        return TernGradCompressor()
    if name == "dgc-0.1%":
        from methods.compression.dgc import DGCCompressor

        return DGCCompressor(density=0.001)
    if name == "onebit":
        from methods.compression.onebit import OneBitCompressor

        return OneBitCompressor()
    raise ValueError(f"unknown compressor {name!r}; known: {COMPRESSORS}")


COMPRESSORS = ["qsgd-4bit", "terngrad", "dgc-0.1%", "onebit"]


@functools.cache
def _buffers(numel: int):
    """(gradient, out): a seeded N(0, 1) fp32 gradient and a touched output buffer, made once per process.

    asv re-runs setup before every sample; keeping the buffers (and each compressor's scratch) alive across samples
    keeps page faults of fresh 100 MB allocations out of the timings.
    """
    generator = torch.Generator().manual_seed(0)
    gradient = torch.randn(numel, generator=generator)
    out = torch.zeros(numel)
    return gradient, out


@functools.cache
def _step(name: str, numel: int) -> Callable[[], object]:
    """One hook-style round trip of compressor `name` on the `numel` gradient (or the copy peer), warmed once."""
    gradient, out = _buffers(numel)
    if name == COPY:
        def step():
            return out.copy_(gradient)
    else:
        compressor = _make(name)

        def step():
            compressed = compressor.compress(gradient, "gradient")
            out.zero_()
            return compressor.decompress_add_(out, compressed.payload, compressed.ctx)
    step()
    return step


def _one_thread() -> None:
    torch.set_num_threads(1)


class Roundtrip:
    """Compress + decompress (hook-style) of a flat fp32 gradient, with the plain copy as a row of its own."""

    params = ([COPY, *COMPRESSORS], SIZES)
    param_names = ["compressor", "numel"]
    repeat = (3, 10, 4.0)  # 3 to 10 samples, stopping after 4 s
    warmup_time = 0.0  # setup has already called the step once
    timeout = 300

    def setup(self, name: str, numel: int) -> None:
        _one_thread()
        self.step = _step(name, numel)

    def time_roundtrip(self, name: str, numel: int) -> None:
        self.step()

    def peakmem_roundtrip(self, name: str, numel: int) -> None:
        """Peak RSS of the process: the input and output buffers (8 bytes/element) plus the compressor's own."""
        self.step()


class VersusCopy:
    """Round-trip seconds divided by copy seconds, measured in alternating blocks in one process.

    At 25M elements only: at 1M the copy runs from cache, and how much of its 4 MB the round trip in between left
    there swings the ratio by 1.5x from run to run.
    """

    params = (COMPRESSORS, [25_000_000])
    param_names = ["compressor", "numel"]
    timeout = 300

    def setup(self, name: str, numel: int) -> None:
        _one_thread()
        self.subject, self.peer = _step(name, numel), _step(COPY, numel)

    def track_ratio_to_copy(self, name: str, numel: int) -> float:
        return interleaved_ratio(self.subject, self.peer, rounds=RATIO_ROUNDS, min_seconds=RATIO_MIN_SECONDS)

    track_ratio_to_copy.unit = "x copy"


class Payload:
    """Bytes one compressed gradient puts on the wire, relative to sending it as fp32 (1.0 for the copy)."""

    params = ([COPY, *COMPRESSORS], SIZES)
    param_names = ["compressor", "numel"]
    timeout = 300

    def setup(self, name: str, numel: int) -> None:
        _one_thread()
        if name == COPY:
            self.nbytes = 4 * numel
        else:
            gradient, _ = _buffers(numel)
            self.nbytes = _make(name).compress(gradient, "gradient").nbytes

    def track_payload_vs_fp32(self, name: str, numel: int) -> float:
        return self.nbytes / (4 * numel)

    track_payload_vs_fp32.unit = "x fp32"
