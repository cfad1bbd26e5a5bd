"""Compress+decompress throughput of every compressor on one 25M-element fp32 gradient, on one thread.

Measured side by side in one run: dtbench's compressors, a straightforward PyTorch port of each (written here,
the way such code usually reads: bernoulli draws, boolean masks, int64 lookups), and `dst.copy_(src)` into a
preallocated buffer as the memory-bandwidth yardstick (not clone: a fresh 100 MB allocation costs page faults that
swing with the allocator).

    python benchmarks/measure/compressors.py [--numel 25000000] [--repeat 3]

Ours is timed the way the DDP hook runs it: compress, then decode into the zeroed bucket slice
(`decompress_add_`). Prints, per compressor: seconds (best of --repeat), GB/s of fp32 input, the ratio to the copy
and the speed-up over the straightforward port.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


# -- straightforward ports, for the side-by-side ratio ---------------------------------------------------------
def naive_qsgd(g: torch.Tensor, s: int = 127, d: int = 128) -> torch.Tensor:
    v = torch.cat([g, g.new_zeros((-g.numel()) % d)]).view(-1, d)
    norm = v.norm(dim=1, keepdim=True)
    r = v.abs() / norm * s
    lower = r.floor()
    xi = lower + torch.bernoulli(r - lower)
    q = (torch.sign(v) * xi).to(torch.int8)
    return (q.to(torch.float32) * norm / s).view(-1)[:g.numel()]


def naive_terngrad(g: torch.Tensor) -> torch.Tensor:
    s = g.abs().max()
    b = torch.bernoulli(g.abs() / s)
    q = (torch.sign(g) * b).to(torch.int8)
    return q.to(torch.float32) * s


def naive_dgc(g: torch.Tensor, density: float = 0.001) -> torch.Tensor:
    n = g.numel()
    k = max(1, int(n * density))
    sample = g[torch.randint(0, n, (max(1, n // 100),))].abs()
    threshold = sample.topk(max(1, int(sample.numel() * density))).values.min()
    mask = g.abs() >= threshold
    indices = mask.nonzero().view(-1)
    values = g[indices]
    if values.numel() > k:
        top = values.abs().topk(k).indices
        indices, values = indices[top], values[top]
    out = torch.zeros(n)
    out[indices] = values
    return out


def naive_onebit(g: torch.Tensor) -> torch.Tensor:
    positive = g >= 0
    mean_pos = g[positive].mean()
    mean_neg = g[~positive].mean()
    return torch.where(positive, mean_pos, mean_neg)


def _ours() -> dict[str, Callable[[], object]]:
    """name -> a compressor instance (imports are lazy, so a missing method only drops its row)."""
    from methods.compression.qsgd import QSGDCompressor

    out: dict[str, object] = {
        "qsgd-8bit-d128": QSGDCompressor(8, 128),
        "qsgd-4bit-d512": QSGDCompressor(4, 512),
        "qsgd-2bit-d128": QSGDCompressor(2, 128),
    }
    try:
        from methods.compression.terngrad import TernGradCompressor

        out["terngrad"] = TernGradCompressor()
    except ImportError:
        pass
    try:
        from methods.compression.dgc import DGCCompressor

        out["dgc-0.1%"] = DGCCompressor(density=0.001)
    except ImportError:
        pass
    try:
        from methods.compression.onebit import OneBitCompressor

        out["onebit"] = OneBitCompressor()
    except ImportError:
        pass
    return out


NAIVE = {"qsgd-8bit-d128": naive_qsgd, "terngrad": naive_terngrad, "dgc-0.1%": naive_dgc, "onebit": naive_onebit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.randn(args.numel)
    dst = torch.empty_like(g)
    copy_s = best_of(lambda: dst.copy_(g), args.repeat * 3)
    gb = g.numel() * 4 / 1e9
    print(f"{args.numel:,} fp32 elements, 1 thread; copy_ into a preallocated buffer: {copy_s * 1e3:.1f} ms "
          f"({gb / copy_s:.1f} GB/s)")
    print(f"{'compressor':<16} {'ours (s)':>9} {'GB/s':>6} {'x copy':>7} {'port (s)':>9} {'speed-up':>8}")
    out = torch.empty_like(g)
    for name, compressor in _ours().items():
        def roundtrip(c=compressor):
            # What the DDP hook does: compress, then decode into the (zeroed) bucket slice.
            compressed = c.compress(g, "g")
            out.zero_()
            return c.decompress_add_(out, compressed.payload, compressed.ctx)

        ours = best_of(roundtrip, args.repeat)
        naive = NAIVE.get(name)
        port = best_of(lambda fn=naive: fn(g), args.repeat) if naive else float("nan")
        print(f"{name:<16} {ours:9.3f} {gb / ours:6.2f} {ours / copy_s:7.1f} {port:9.3f} {port / ours:8.2f}")


if __name__ == "__main__":
    main()
