"""Our zb-h1 step against torch.distributed.pipelining's zero-bubble schedule of the same shape, and its measured
bubble against the paper's formula.

The setup of benchmarks/measure/pipeline_step.py: a compute-bound MLP of 8 x Linear(2048, 2048), batch 256, M = 8
microbatches, 2 ranks x 1 thread, gloo, one stage of 4 layers per rank. Our zb-h1 and 1f1b executors and torch's
ScheduleInterleavedZeroBubble (given one stage per rank: ZB-H1's shape) and Schedule1F1B run in the same 2 processes
in alternating blocks; per block the slower rank's time counts. The bubbles are harness.trace.step_bubble over our
traced steps (median), against ZB-H1's (S-1)(T_F + T_B - T_W) / (M(T_F + T_B + T_W) + (S-1)(T_F + T_B - T_W)) with
T_F, T_B, T_W the median traced forward, B and W of the stages, and 1F1B's (S-1)/(M+S-1).

    python benchmarks/measure/zero_bubble_step.py [--rounds 5] [--steps 3] [--width 2048] [--json OUT]
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
    from zero_bubble_ranks import VARIANTS, zero_bubble_against_torch

    from _dist import spawn
    from harness.trace import ideal_bubble, step_bubble, zb_h1_bubble

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    a = parser.parse_args()
    ranks = spawn(zero_bubble_against_torch, 2, a.rounds, a.steps, a.width, a.layers, a.batch, a.microbatches,
                  timeout=3600)
    per_round = {name: [max(v) for v in zip(*(r[name] for r in ranks), strict=True)] for name in VARIANTS}
    med = {name: statistics.median(values) for name, values in per_round.items()}
    ratio = [o / t for o, t in zip(per_round["ours_zb_h1"], per_round["torch_zero_bubble"], strict=True)]
    over_1f1b = [z / o for z, o in zip(per_round["ours_zb_h1"], per_round["ours_1f1b"], strict=True)]

    def bubble(kind: str) -> float:
        return statistics.median(step_bubble(list(steps)) for steps in zip(*(r[f"{kind}_traces"] for r in ranks),
                                                                           strict=True))

    def median_op(op: str) -> float:
        return statistics.median(e.duration for r in ranks for step in r["zb_h1_traces"] for e in step
                                 if e.op == op and (op == "forward" or e.stage > 0))  # stage 0's B is whole

    t_f, t_b, t_w = median_op("forward"), median_op("backward_input"), median_op("backward_weight")
    out = {**med, "zb_over_torch": statistics.median(ratio), "zb_over_1f1b": statistics.median(over_1f1b),
           "zb_h1_bubble_measured": bubble("zb_h1"), "1f1b_bubble_measured": bubble("1f1b"),
           "zb_h1_bubble_formula": zb_h1_bubble(2, a.microbatches, t_f, t_b, t_w),
           "1f1b_bubble_formula": ideal_bubble(2, a.microbatches), "t_forward": t_f, "t_input": t_b, "t_weight": t_w}
    print(f"{a.layers} x Linear({a.width}, {a.width}), batch {a.batch}, M = {a.microbatches}, 2 ranks x 1 thread, "
          f"gloo; {a.rounds} rounds x {a.steps} steps, interleaved (median of per-round max over ranks)")
    for name in VARIANTS:
        print(f"  {name:18s} {med[name]:7.3f} s/step")
    print(f"  ours zb-h1 / torch ScheduleInterleavedZeroBubble (goal <= 1): {out['zb_over_torch']:.3f} (rounds: "
          f"{' '.join(f'{r:.3f}' for r in ratio)}); ours zb-h1 / ours 1f1b: {out['zb_over_1f1b']:.3f}")
    print(f"  T_F {t_f * 1e3:.1f} ms, T_B {t_b * 1e3:.1f} ms, T_W {t_w * 1e3:.1f} ms "
          "(median traced; B and W of stage 1)")
    print(f"  bubble zb-h1 measured {out['zb_h1_bubble_measured']:.3f}, formula {out['zb_h1_bubble_formula']:.3f}; "
          f"1f1b measured {out['1f1b_bubble_measured']:.3f}, formula {out['1f1b_bubble_formula']:.3f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
