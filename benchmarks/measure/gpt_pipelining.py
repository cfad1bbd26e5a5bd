"""Our gpipe and 1f1b steps on the GPT against torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B.

shakespeare-gpt (n_layer 4, n_head 4, d_model 128, context 64 by default) on 2 gloo ranks x 1 thread (real
processes, forked as tests/_dist.spawn forks them), cut in the same place for both: the first half of the model's
blocks [Embeddings, n_layer TransformerBlocks, Head] on rank 0 (partition [(n_layer + 2) // 2]), the rest on rank 1.
The same batch (`--batch`, 12 by default, from DataOrder seed 0), microbatches (`--microbatches`, 4), loss
(sequence_cross_entropy), initial weights (seed 0) and optimizer on both sides, the update included:

- ours: the gpipe / 1f1b method's train_step (the schedule, the global grad_clip: the stages' squared norms
  all-reduced, each stage's clip and AdamW update, foreach=False), as a run calls it.
- theirs: zero_grad; PipelineStage + ScheduleGPipe / Schedule1F1B `step`; the same global clip written the plain way
  (each rank's squared norm, dist.all_reduce, clip_grads_with_norm_); AdamW(foreach=False).step().

Before timing, one step of each side from the same weights on the same batch: the losses (last rank) and the largest
parameter difference after the step are printed. Then the four variants alternate in blocks of `--steps` steps in
the same two processes (order reversed every other round, a barrier before and after each block, per block the
slower rank's time counts), after `--steps` warm-up steps each.

    DTBENCH_CACHE_DIR=/tmp/dtcache python benchmarks/measure/gpt_pipelining.py [--steps 10] [--blocks 9]
        [--microbatches 4]
        [--batch 12] [--n-layer 4] [--d-model 128] [--grad-clip 1.0] [--corpus DIR] [--json OUT]

`--corpus DIR` trains on a folder of text files instead of the pinned Shakespeare (the workload's `corpus` option).

Prints the median step time of each variant and, per schedule, the ratio ours / theirs (median of per-round ratios,
a bootstrap 95% interval, the ratio of the fastest blocks) with a verdict against the goal ratio <= 1.00.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks" / "measure"),
                 str(ROOT / "benchmarks" / "asv")]

WORKLOAD = "shakespeare-gpt"
SCHEDULES = ("gpipe", "1f1b")
VARIANTS = ("ours_gpipe", "torch_gpipe", "ours_1f1b", "torch_1f1b")
GOAL = 1.00


def _rank(rank: int, world_size: int, options: dict, batch: int, microbatches: int, grad_clip: float | None,
          steps: int, blocks: int, exchange: str = "prepost") -> dict[str, Any]:
    """This rank's per-block step times of the four variants, and the one-step check of each schedule."""
    import torch
    import torch.distributed as dist
    from dtbench_bench_ranks import interleaved
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    from harness import registry
    from harness.comm.communicator import Communicator
    from harness.data.tensors import Batch, DataOrder
    from harness.method import RunContext
    from harness.models.gpt import sequence_cross_entropy

    torch.use_deterministic_algorithms(True)  # the suites' default, as the worker sets it (for both sides alike)
    workload = registry.WORKLOADS.get(WORKLOAD)
    instance = workload.instantiate(options)
    train = instance.train
    cut = len(instance.make_model()) // 2
    comm = Communicator(rank, world_size, dist.group.WORLD)
    folder = Path(tempfile.mkdtemp(prefix="dtbench-gpt-pipelining-"))
    order = DataOrder(len(train), batch, seed=0)

    def ours(name: str):
        cls = registry.METHODS.get(name)
        merged = {k: v for k, v in workload.hyperparameters.items() if k in cls.Params.model_fields}
        merged.update(batch_size=batch, microbatches=microbatches, partition=[cut], grad_clip=grad_clip,
                      lr_schedule="constant", lr_warmup_steps=0, exchange=exchange)
        ctx = RunContext(rank=rank, world_size=world_size, device=torch.device("cpu"), workload=instance,
                         params=cls.Params.model_validate(merged), comm=comm, seed=0, run_dir=folder,
                         log=lambda kind, **f: None)
        torch.manual_seed(0)
        method = cls(ctx)
        count = [0]

        def step() -> float | None:
            t = count[0]
            count[0] += 1
            return method.train_step(Batch(t, order.epoch_of(t), order.batch(t), train, 0)).loss
        return step, method, [p for p in method.stages[rank].module.parameters()]

    def theirs(cls, p: Any):
        torch.manual_seed(0)
        full = instance.make_model()
        module = full[:cut] if rank == 0 else full[cut:]
        params = list(module.parameters())
        optimizer = torch.optim.AdamW(params, lr=p.lr, betas=tuple(p.betas), eps=p.eps, weight_decay=p.weight_decay,
                                      foreach=False)
        schedule = cls(PipelineStage(module, rank, world_size, torch.device("cpu")), n_microbatches=microbatches,
                       loss_fn=sequence_cross_entropy)
        count = [0]

        def step() -> float | None:
            idx = order.batch(count[0])
            count[0] += 1
            optimizer.zero_grad(set_to_none=True)
            losses: list = []
            if rank == 0:
                schedule.step(train.inputs(idx))
            else:
                schedule.step(target=train.targets(idx), losses=losses)
            if grad_clip is not None:
                squared = get_total_norm([q.grad for q in params if q.grad is not None]) ** 2
                dist.all_reduce(squared)
                clip_grads_with_norm_(params, grad_clip, squared.sqrt())
            optimizer.step()
            return float(torch.stack(losses).detach().mean()) if losses else None
        return step, params

    variants, checks, methods = {}, {}, []
    for name, cls in zip(SCHEDULES, (ScheduleGPipe, Schedule1F1B), strict=True):
        our_step, method, our_params = ours(name)
        their_step, their_params = theirs(cls, method.ctx.params)
        same_init = all(torch.equal(a, b) for a, b in zip(our_params, their_params, strict=True))
        dist.barrier()
        our_loss = our_step()
        dist.barrier()
        their_loss = their_step()
        diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(our_params, their_params, strict=True))
        checks[name] = {"same_init": same_init, "ours_loss": our_loss, "torch_loss": their_loss,
                        "max_param_diff": diff}
        variants[f"ours_{name}"], variants[f"torch_{name}"] = our_step, their_step
        methods.append(method)
    times: dict[str, Any] = interleaved(variants, blocks, steps, warmup=steps, barrier_after=True)
    for method in methods:
        method.finish()
    return {"times": times, "checks": checks, "cut": cut, "load_average": os.getloadavg()}


def main() -> None:
    from gpt_step import summarize

    from _dist import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per block (and warm-up steps of each variant)")
    parser.add_argument("--blocks", type=int, default=9, help="rounds of one block of each variant")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=12, help="the global batch (divisible by --microbatches)")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--grad-clip", type=float, default=1.0, help="the global clip norm on both sides (0: off)")
    parser.add_argument("--exchange", choices=("prepost", "fused"), default="prepost",
                        help="our pipelines' exchange (docs/benchmarks.md): prepost (the default) or fused (receives "
                             "at their action, sends paired with them, as torch's schedules do)")
    parser.add_argument("--corpus", type=Path, metavar="DIR",
                        help="a folder of text files to train on instead of the pinned Shakespeare")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    a = parser.parse_args()
    if a.batch % a.microbatches:
        parser.error(f"--batch {a.batch} is not divisible by --microbatches {a.microbatches}")
    options = {"n_layer": a.n_layer, "n_head": a.n_head, "d_model": a.d_model, "context": a.context,
               **({"corpus": str(a.corpus.resolve())} if a.corpus else {})}
    clip = a.grad_clip or None
    load_before = os.getloadavg()
    ranks = spawn(_rank, 2, options, a.batch, a.microbatches, clip, a.steps, a.blocks, a.exchange, timeout=3600)
    per_block = {name: [max(v) for v in zip(*(r["times"][name] for r in ranks), strict=True)] for name in VARIANTS}
    med = {name: statistics.median(values) for name, values in per_block.items()}
    ratios = {s: summarize(per_block[f"ours_{s}"], per_block[f"torch_{s}"], GOAL, f"ours/torch {s}")
              for s in SCHEDULES}
    cut = ranks[0]["cut"]
    print(f"{WORKLOAD} {options}, batch {a.batch}, M = {a.microbatches}, AdamW, grad_clip {clip}; 2 ranks x 1 "
          f"thread, gloo, exchange {a.exchange}; blocks [0, {cut}) on rank 0, [{cut}, {a.n_layer + 2}) on rank 1; "
          f"{a.blocks} blocks x {a.steps} steps of each, interleaved (load average {load_before[0]:.2f} -> "
          f"{ranks[0]['load_average'][0]:.2f})")
    for s in SCHEDULES:
        c0, c1 = ranks[0]["checks"][s], ranks[1]["checks"][s]
        same = abs(c1["ours_loss"] - c1["torch_loss"]) <= 1e-6 * abs(c1["torch_loss"])
        print(f"check {s:5s}: same initial weights {c0['same_init'] and c1['same_init']}; first-step loss ours "
              f"{c1['ours_loss']:.6f}, torch {c1['torch_loss']:.6f} ({'same' if same else 'DIFFERENT'}); largest "
              f"parameter difference after the step {max(c0['max_param_diff'], c1['max_param_diff']):.1e}")
    for name in VARIANTS:
        print(f"  {name:12s} {med[name] * 1e3:8.2f} ms/step (median of blocks, slower rank)")
    for s, r in ratios.items():
        print(f"ratio ours/torch {s:5s}: {r['ratio']:.3f} (median of per-round ratios; 95% interval "
              f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]; fastest blocks {r['ratio_of_fastest']:.3f})")
    for s, r in ratios.items():
        print(f"verdict {s} (goal ours/torch <= {GOAL:.2f}): {r['verdict']}")
    if a.json:
        a.json.write_text(json.dumps({"config": {"workload": WORKLOAD, "options": options, "batch": a.batch,
                                                 "microbatches": a.microbatches, "grad_clip": clip, "cut": cut,
                                                 "steps": a.steps, "blocks": a.blocks},
                                      "median_s": med, "ratios": ratios,
                                      "checks": [r["checks"] for r in ranks], "block_s": per_block}, indent=2))


if __name__ == "__main__":
    main()
