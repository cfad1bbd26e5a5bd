"""The harness's ddp step time against plain torch DDP (built-in C++ all-reduce, no harness), interleaved in one run.

Both variants run in the same 2 gloo processes, on the same model, data shards and optimizer, alternating blocks of
steps so that machine noise hits both alike. The harness variant is the full per-step path of the runner
(`Loop.train_one_step`: batch selection, the ddp method with its accounted Python comm hook, the train record written
to metrics.jsonl, the ranks' periodic agreement). The plain variant is the textbook DDP loop.

    python benchmarks/measure/ddp_overhead.py [--workload digits-mlp] [--rounds 15] [--steps 40]

Prints the median step time of each, their ratio (harness / plain; the goal is <= 1.05), and the runner's own cost
per step: the harness step minus the method's step alone (`train_step` without the Loop), in microseconds (the goal
is <= 200 us; asv tracks the same number on digits-mlp as runner.RunnerCost.track_runner_cost_per_step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks" / "asv")]  # _dist, and the shared rank-side loop


def _bench(rank: int, world_size: int, workload: str, options: dict, rounds: int, steps: int, batch_size: int):
    import torch
    from dtbench_bench_ranks import interleaved, make_loop
    from torch.nn.parallel import DistributedDataParallel

    from harness.data.tensors import DataOrder

    params = {"batch_size": batch_size, "lr": 0.01, "momentum": 0.9}
    loop = make_loop("ddp", rank, world_size, Path(tempfile.mkdtemp()), workload, params, options)
    method, ctx, writer = loop.method, loop.method.ctx, loop.writer

    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch.manual_seed(0)
    plain_model = DistributedDataParallel(ctx.workload.make_model())
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(0)
    hooked_model = DistributedDataParallel(ctx.workload.make_model())
    hooked_model.register_comm_hook(None, allreduce_hook)
    hooked_opt = torch.optim.SGD(hooked_model.parameters(), lr=0.01, momentum=0.9)
    order = DataOrder(len(ctx.workload.train), batch_size, seed=0)
    train = ctx.workload.train
    per = batch_size // world_size
    plain_step = 0

    def textbook_step(model, opt) -> None:
        nonlocal plain_step
        idx = order.batch(plain_step)[rank * per:(rank + 1) * per]
        x, y = train.inputs(idx), train.targets(idx)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        plain_step += 1

    def plain() -> None:
        textbook_step(plain_model, plain_opt)

    def torch_python_hook() -> None:
        textbook_step(hooked_model, hooked_opt)

    def harness() -> None:
        loop.train_one_step()

    from harness.data.tensors import Batch

    method_step = 0

    def method_only() -> None:
        nonlocal method_step
        method.train_step(Batch(method_step, 0.0, order.batch(method_step), train, 0))
        method_step += 1

    variants = {"harness": harness, "plain": plain, "method": method_only, "torch_hook": torch_python_hook}
    times = interleaved(variants, rounds, steps, warmup=steps, clocks={"harness": loop.clock})
    writer.close()
    return times


def main() -> None:
    from dtbench_bench_ranks import per_round_cost

    from _dist import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="digits-mlp")
    parser.add_argument("--options", default="{}", help="workload options as JSON, e.g. '{\"hidden\": 1024}'")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    results = spawn(_bench, 2, args.workload, json.loads(args.options), args.rounds, args.steps, args.batch_size,
                    timeout=1800)
    harness = [max(a, b) for a, b in zip(results[0]["harness"], results[1]["harness"], strict=True)]
    plain = [max(a, b) for a, b in zip(results[0]["plain"], results[1]["plain"], strict=True)]
    method = [max(a, b) for a, b in zip(results[0]["method"], results[1]["method"], strict=True)]
    torch_hook = [max(a, b) for a, b in zip(results[0]["torch_hook"], results[1]["torch_hook"], strict=True)]
    h, p = statistics.median(harness), statistics.median(plain)
    ratios = [a / b for a, b in zip(harness, plain, strict=True)]
    print(f"workload {args.workload} {args.options}, 2 ranks x 1 thread, batch {args.batch_size}, "
          f"{args.rounds} rounds x {args.steps} steps, interleaved")
    print(f"plain torch DDP : {p * 1e3:8.3f} ms/step (median)")
    print(f"dtbench ddp     : {h * 1e3:8.3f} ms/step (median), the runner's whole step")
    print(f"  method alone  : {statistics.median(method) * 1e3:8.3f} ms/step (median), train_step without the runner")
    print(f"torch + Python allreduce_hook: {statistics.median(torch_hook) * 1e3:8.3f} ms/step (median), "
          f"torch's own Python hook, for scale")
    print(f"ratio harness/plain: {h / p:.3f} (median of per-round ratios {statistics.median(ratios):.3f}; "
          f"goal <= 1.05)")
    cost = sorted(c * 1e6 for c in per_round_cost(results, whole="harness", method="method"))
    print(f"runner's cost per step (harness - method alone): {statistics.median(cost):.0f} us (median of per-round "
          f"differences; rounds {cost[0]:.0f} to {cost[-1]:.0f}; goal <= 200 us)")


if __name__ == "__main__":
    main()
