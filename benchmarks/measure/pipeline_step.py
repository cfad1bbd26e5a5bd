"""Our gpipe, 1f1b and interleaved-1f1b step time against torch.distributed.pipelining's, and against
single-process baselines.

The issue's setup: a compute-bound MLP of 8 x Linear(2048, 2048), batch 256, M = 8 microbatches, 2 ranks x 1 thread,
gloo; gpipe and 1f1b on 2 stages of 4 layers, interleaved on 4 stages of 2 layers (2 per rank). The six pipeline
variants run in the same 2 processes in alternating blocks, so machine noise hits them alike; per block the slower
rank's time counts. Then, with the ranks gone, the whole model runs in this process: one thread accumulating the
same 8 microbatches, and two threads on the whole batch (the baseline a user of a 2-core machine would pick). The
measured gpipe and interleaved bubbles are printed next to (p-1)/(v·M+p-1).

Each variant's minor page faults per step are printed by rank (`--allocator system`: glibc's malloc defaults, under
which a rank can fault thousands of pages a step in again). `--exchange fused` runs our gpipe and 1f1b with receives
posted at their action instead of at the step's start (docs/benchmarks.md measures both).

    python benchmarks/measure/pipeline_step.py [--rounds 5] [--steps 3] [--width 2048] [--allocator retain]
        [--exchange prepost]
                                        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks" / "asv")]


def main() -> None:
    from dtbench_bench_ranks import single_process_baselines
    from pipeline_ranks import VARIANTS, pipeline_against_torch

    from _dist import spawn
    from harness.run.allocator import configure
    from harness.trace import ideal_bubble, step_bubble

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--allocator", choices=("retain", "system"), default="retain",
                        help="the ranks' malloc policy, as a suite's `allocator` key (harness/run/allocator.py): "
                        "retain (the harness's default) or system (the C library's defaults)")
    parser.add_argument("--exchange", choices=("prepost", "fused"), default="prepost",
                        help="our gpipe's and 1f1b's `exchange` parameter (interleaved always pre-posts)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    a = parser.parse_args()
    sizes = dict(width=a.width, layers=a.layers, batch=a.batch, microbatches=a.microbatches)
    ranks = spawn(pipeline_against_torch, 2, a.rounds, a.steps, *sizes.values(), 2, a.exchange, timeout=3600,
                  allocator=a.allocator)
    per_round = {name: [max(v) for v in zip(*(r[name] for r in ranks), strict=True)] for name in VARIANTS}
    med = {name: statistics.median(values) for name, values in per_round.items()}
    ratios = {kind: [o / t for o, t in zip(per_round[f"ours_{kind}"], per_round[f"torch_{kind}"], strict=True)]
              for kind in ("gpipe", "1f1b", "interleaved")}
    bubbles = {kind: statistics.median(step_bubble(list(steps)) for steps in zip(*(r[f"{kind}_traces"] for r in ranks),
                                                                                   strict=True))
               for kind in ("gpipe", "interleaved")}
    configure(a.allocator)  # the baselines run in this process, under the ranks' policy
    base = single_process_baselines(max(3, a.steps), *sizes.values())
    faults = {name: [r["page_faults"][name] for r in ranks] for name in VARIANTS}
    out = {**med, **base, "allocator": a.allocator, "exchange": a.exchange,
           "page_faults_per_step": faults,
           **{f"{k}_ratio": statistics.median(v) for k, v in ratios.items()},
           "bubble_measured": bubbles["gpipe"], "bubble_ideal": ideal_bubble(2, a.microbatches),
           "interleaved_bubble_measured": bubbles["interleaved"],
           "interleaved_bubble_ideal": ideal_bubble(2, a.microbatches, 2)}
    print(f"{a.layers} x Linear({a.width}, {a.width}), batch {a.batch}, M = {a.microbatches}, 2 ranks x 1 thread, "
          f"gloo, allocator {a.allocator}, exchange {a.exchange}; {a.rounds} rounds x {a.steps} steps, interleaved "
          f"(median of per-round max over ranks; page faults: mean per step, by rank)")
    for name in VARIANTS:
        print(f"  {name:17s} {med[name]:7.3f} s/step   page faults {' '.join(f'{f:8.0f}' for f in faults[name])}")
    print("  ours / torch (median of per-round ratios; goal <= 1): " + ", ".join(
        f"{kind} {statistics.median(v):.3f} (rounds: {' '.join(f'{r:.3f}' for r in v)})" for kind, v in ratios.items()))
    print(f"single process: 1 thread, {a.microbatches} microbatches accumulated {base['one_thread_accumulated']:.3f} "
          f"s/step; 2 threads, whole batch {base['two_threads_whole']:.3f} s/step")
    for name in ("ours_gpipe", "ours_1f1b"):
        print(f"  speed-up of {name}: {base['one_thread_accumulated'] / med[name]:.2f}x over 1 thread accumulated "
              f"(the bubble's limit S(1 - bubble) = {2 * (1 - ideal_bubble(2, a.microbatches)):.2f}x), "
              f"{base['two_threads_whole'] / med[name]:.2f}x over 2 threads on the whole batch")
    print(f"gpipe bubble measured {out['bubble_measured']:.3f}, ideal (p-1)/(M+p-1) = {out['bubble_ideal']:.3f}: "
          f"{'within' if abs(out['bubble_measured'] - out['bubble_ideal']) <= 0.05 else 'NOT within'} 0.05")
    print(f"interleaved bubble measured {out['interleaved_bubble_measured']:.3f}, ideal (p-1)/(vM+p-1) = "
          f"{out['interleaved_bubble_ideal']:.3f} (medians over the traced steps)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
