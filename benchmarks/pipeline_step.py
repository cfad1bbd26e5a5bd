"""Our gpipe and 1f1b step time against torch.distributed.pipelining's, and against single-process baselines.

The issue's setup: a compute-bound MLP of 8 x Linear(2048, 2048), batch 256, M = 8 microbatches, 2 stages of 4
layers, one thread per rank, gloo. The four pipeline variants run in the same 2 processes in alternating blocks, so
machine noise hits them alike; per block the slower rank's time counts. Then, with the ranks gone, the whole model
runs in this process: one thread accumulating the same 8 microbatches, and two threads on the whole batch (the
baseline a user of a 2-core machine would pick). The measured GPipe bubble is printed next to (S-1)/(M+S-1).

    python benchmarks/pipeline_step.py [--rounds 3] [--steps 3] [--width 2048] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks" / "asv")]


def main() -> None:
    from dtbench_bench_ranks import pipeline_against_torch, single_process_baselines

    from _dist import spawn
    from harness.trace import ideal_bubble, step_bubble

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    a = parser.parse_args()
    sizes = dict(width=a.width, layers=a.layers, batch=a.batch, microbatches=a.microbatches)
    ranks = spawn(pipeline_against_torch, 2, a.rounds, a.steps, *sizes.values(), timeout=3600)
    med = {name: statistics.median(max(v) for v in zip(*(r[name] for r in ranks), strict=True))
           for name in ("ours_gpipe", "torch_gpipe", "ours_1f1b", "torch_1f1b")}
    bubbles = [step_bubble(list(steps)) for steps in zip(*(r["gpipe_traces"] for r in ranks), strict=True)]
    base = single_process_baselines(max(3, a.steps), *sizes.values())
    out = {**med, **base, "bubble_measured": statistics.median(bubbles),
           "bubble_ideal": ideal_bubble(2, a.microbatches)}
    print(f"{a.layers} x Linear({a.width}, {a.width}), batch {a.batch}, M = {a.microbatches}, 2 stages x 1 thread, "
          f"gloo; {a.rounds} rounds x {a.steps} steps, interleaved (median of per-round max over ranks)")
    for name in ("ours_gpipe", "torch_gpipe", "ours_1f1b", "torch_1f1b"):
        print(f"  {name:12s} {med[name]:7.3f} s/step")
    print(f"  ours / torch: gpipe {med['ours_gpipe'] / med['torch_gpipe']:.3f}, "
          f"1f1b {med['ours_1f1b'] / med['torch_1f1b']:.3f} (goal: <= 1)")
    print(f"single process: 1 thread, {a.microbatches} microbatches accumulated {base['one_thread_accumulated']:.3f} "
          f"s/step; 2 threads, whole batch {base['two_threads_whole']:.3f} s/step")
    for name in ("ours_gpipe", "ours_1f1b"):
        print(f"  speed-up of {name}: {base['one_thread_accumulated'] / med[name]:.2f}x over 1 thread accumulated "
              f"(the bubble's limit S(1 - bubble) = {2 * (1 - ideal_bubble(2, a.microbatches)):.2f}x), "
              f"{base['two_threads_whole'] / med[name]:.2f}x over 2 threads on the whole batch")
    print(f"gpipe bubble measured {out['bubble_measured']:.3f} (median over {len(bubbles)} steps), "
          f"ideal (S-1)/(M+S-1) = {out['bubble_ideal']:.3f}: "
          f"{'within' if abs(out['bubble_measured'] - out['bubble_ideal']) <= 0.05 else 'NOT within'} 0.05 (the goal)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
