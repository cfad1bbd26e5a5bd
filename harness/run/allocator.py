"""The rank's host allocator policy: keep glibc's malloc from handing freed memory back to the OS between steps."""

from __future__ import annotations

import ctypes
import platform

from harness.suite.spec import Allocator

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Chunks up to this size come from the heap, not from a fresh mmap each time (glibc's own dynamic threshold stops
#: at 32 MiB and moves with the order of frees).
RETAIN_MMAP_THRESHOLD = 1 << 30
#: The heap's free top is never given back (trimmed) below this size.
RETAIN_TRIM_THRESHOLD = (1 << 31) - 1


def configure(policy: Allocator) -> str:
    """Apply `policy` to this process's malloc; returns what was done, for the manifest.

    Why: a training step frees and re-allocates the same large tensors (weight gradients, set to None by
    zero_grad, and their per-microbatch temporaries). With glibc's defaults a free that leaves a large free top of
    the heap trims it (returns it to the OS), or a tensor above the moving mmap threshold is unmapped, and the next
    step's allocation page-faults every 4 KiB page again. Whether that happens depends on what else lies on the heap,
    so two methods doing the same arithmetic can differ by thousands of faults a step (docs/benchmarks.md measures
    24,500 against 5 on one pipeline rank: 5 % of its step). `retain` fixes both thresholds high, so freed memory
    stays mapped and is reused: a rank's resident memory then stays at its peak, as a caching allocator's does.
    Off glibc (musl, macOS) nothing is changed and the answer says so.
    """
    if policy == "system":
        return "system: the C library's malloc defaults"
    if policy != "retain":
        raise ValueError(f"allocator must be 'retain' or 'system', got {policy!r}")
    libc_name, version = platform.libc_ver()
    if libc_name != "glibc":
        return f"retain requested, but the C library is {libc_name or 'unknown'}: its defaults left as is"
    libc = ctypes.CDLL(None)
    wanted = {"M_MMAP_THRESHOLD": (_M_MMAP_THRESHOLD, RETAIN_MMAP_THRESHOLD),
              "M_TRIM_THRESHOLD": (_M_TRIM_THRESHOLD, RETAIN_TRIM_THRESHOLD)}
    done = {name: value for name, (param, value) in wanted.items() if libc.mallopt(param, value) == 1}
    text = f"retain: glibc {version} mallopt " + (" ".join(f"{k}={v}" for k, v in done.items()) or "(none)")
    refused = [name for name in wanted if name not in done]
    return text + (f"; refused: {' '.join(refused)}" if refused else "")
