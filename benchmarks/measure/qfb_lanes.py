"""Q-FB's lanes: the speed-up of lanes = 2 (forward and backward at once) over lanes = 1 on a compute-bound MLP,
against the ideal (F+B)/max(F,B) from the measured forward and backward times.

One stage on one rank (the default): qfb in this process, its lanes as threads (one stage has no messages, so the
speed-up is the lanes' alone). Variants, timed in alternating blocks so machine noise hits them alike:
    1 lane x T threads     forward and backward in turn (lanes = 1), T intra-op threads
    2 lanes x T threads    forward and backward lanes at once, T threads each (twice the cores)
    1 lane x 2T threads    the same cores as 2 lanes x T: the fair comparison on a fixed machine
F and B are the median per-microbatch forward and backward times of the 1-lane x T-thread variant. A window of M
microbatches on one stage takes M(F+B) in one lane and at best F + M·max(F,B) in two (exact sync: the first
backward waits for the first forward; the update after the last backward), so the ideal speed-up is
M(F+B) / (M·max(F,B) + min(F,B)), tending to (F+B)/max(F,B); bounded sync (`--sync bounded`) overlaps windows too.
With `--ranks 2` the model is cut into 2 stages on 2 gloo processes (each with its lanes: 4T cores in all).

The machine's load (os.getloadavg) is printed before and after, and for each variant the cores it got: the process's
CPU seconds over wall seconds (time.process_time, all threads). Lanes need free cores: when 2 lanes get about one
core, no speed-up can show, so run it on a quiet machine.

    python benchmarks/measure/qfb_lanes.py [--threads 1] [--rounds 5] [--steps 3] [--width 2048] [--depth 4]
                                   [--batch 256] [--microbatches 8] [--sync exact] [--ranks 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

VARIANTS = ("1 lane x T", "2 lanes x T", "1 lane x 2T")


def _variants(rank: int, world_size: int, a: dict) -> dict:
    """name -> (method, intra-op threads of the calling thread) on this rank."""
    from _dist import context

    options = {"in_features": a["width"], "hidden": a["width"], "depth": a["depth"], "classes": 10,
               "num_train": 4 * a["batch"], "num_test": a["batch"]}
    common = {"batch_size": a["batch"], "microbatches": a["microbatches"], "lr": 0.01, "momentum": 0.9,
              "sync": a["sync"], "trace_steps": 0, "stages": world_size}
    out = {}
    for name, lanes, threads in (("1 lane x T", 1, a["threads"]), ("2 lanes x T", 2, a["threads"]),
                                 ("1 lane x 2T", 1, 2 * a["threads"])):
        cls, ctx = context("qfb", rank, world_size, {**common, "lanes": lanes, "lane_threads": a["threads"]},
                           workload="synthetic-mlp", options=options)
        out[name] = (cls(ctx), threads)
    return out


def _time(rank: int, world_size: int, a: dict) -> dict:
    """Seconds per step and cores used (CPU seconds / wall seconds) of each variant, per round; and F, B per
    microbatch of the first variant."""
    import torch
    import torch.distributed as dist

    from harness.data.tensors import Batch, DataOrder

    variants = _variants(rank, world_size, a)
    data = next(iter(variants.values()))[0].ctx.workload.train
    order = DataOrder(len(data), a["batch"], seed=0)
    step = {name: 0 for name in variants}

    cores: dict[str, list[float]] = {name: [] for name in variants}

    def block(name: str, steps: int) -> float:
        method, threads = variants[name]
        torch.set_num_threads(threads)
        if world_size > 1:
            dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            t = step[name]
            method.train_step(Batch(t, 0.0, order.batch(t), data, 0))
            step[name] += 1
        wall = time.perf_counter() - start
        cores[name].append((time.process_time() - cpu) / wall)
        if world_size > 1:
            dist.barrier()
        return wall / steps

    for name in variants:
        block(name, 1)  # warm-up
        cores[name].clear()
    reference = variants["1 lane x T"][0]
    for times in reference.clock.times.values():  # F and B: measured during the timed rounds only
        times.forward_s = times.backward_s = 0.0
        times.forwards = times.backwards = 0
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(a["rounds"]):
        for name in VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS)):
            seconds[name].append(block(name, a["steps"]))
    stage = reference.clock.times[rank if world_size > 1 else 0]
    for method, _ in variants.values():
        method.finish()
    return {"seconds": seconds, "cores": {name: statistics.median(v) for name, v in cores.items()},
            "forward_s": stage.forward_s / max(1, stage.forwards),
            "backward_s": stage.backward_s / max(1, stage.backwards)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="T: intra-op threads per lane")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--sync", choices=("exact", "bounded"), default="exact")
    parser.add_argument("--ranks", type=int, choices=(1, 2), default=1)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    a = vars(parser.parse_args())
    load_before = os.getloadavg()
    if a["ranks"] == 1:
        ranks = [_time(0, 1, a)]
    else:
        from _dist import spawn

        ranks = spawn(_time, 2, a, timeout=3600)
    load_after = os.getloadavg()
    per_round = {name: [max(v) for v in zip(*(r["seconds"][name] for r in ranks), strict=True)] for name in VARIANTS}
    med = {name: statistics.median(v) for name, v in per_round.items()}
    speedup = [one / two for one, two in zip(per_round["1 lane x T"], per_round["2 lanes x T"], strict=True)]
    fair = [one / two for one, two in zip(per_round["1 lane x 2T"], per_round["2 lanes x T"], strict=True)]
    f = max(r["forward_s"] for r in ranks)
    b = max(r["backward_s"] for r in ranks)
    m = a["microbatches"]
    ideal_limit = (f + b) / max(f, b)
    ideal_window = m * (f + b) / (m * max(f, b) + (0 if a["sync"] == "bounded" else min(f, b)))
    out = {**a, "json": None, "seconds_per_step": med, "forward_s": f, "backward_s": b,
           "speedup": statistics.median(speedup), "speedup_rounds": speedup,
           "speedup_same_cores": statistics.median(fair), "cores_used": [r["cores"] for r in ranks],
           "ideal": ideal_limit, "ideal_window": ideal_window,
           "load_before": load_before, "load_after": load_after, "cpus": os.cpu_count()}
    print(f"qfb, {a['ranks']} stage(s) on {a['ranks']} rank(s), synthetic-mlp {a['depth']} x {a['width']}, batch "
          f"{a['batch']}, M = {m}, sync {a['sync']}, T = {a['threads']}; {a['rounds']} rounds x {a['steps']} steps "
          f"(median of per-round times, slower rank)")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after "
          f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}, on {os.cpu_count()} CPUs")
    for name in VARIANTS:
        used = " + ".join(f"{r['cores'][name]:.2f}" for r in ranks)
        per_rank = ", per rank" if len(ranks) > 1 else ""
        print(f"  {name:12s} {med[name]:7.3f} s/step, cores used (CPU s / wall s{per_rank}) {used}")
    print(f"F = {f * 1e3:.1f} ms, B = {b * 1e3:.1f} ms per microbatch (1 lane x T)")
    print(f"speed-up of 2 lanes over 1 lane (T threads each): {out['speedup']:.2f}x (rounds: "
          f"{' '.join(f'{s:.2f}' for s in speedup)}); ideal (F+B)/max(F,B) = {ideal_limit:.2f}x, for a window of "
          f"M = {m}: {ideal_window:.2f}x")
    print(f"on the same cores (1 lane x 2T): {out['speedup_same_cores']:.2f}x")
    if a["json"]:
        a["json"].write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
