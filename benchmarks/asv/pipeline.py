"""The pipeline family: schedule generation, a virtual-executor step, and the gpipe, 1f1b and interleaved-1f1b
steps against torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B on 2 gloo ranks
(with the measured gpipe and interleaved bubbles)."""

from __future__ import annotations

import statistics

import torch  # at import: asv's forkserver then imports it once for every benchmark process

PEER_SIZES = {"width": 512, "layers": 8, "batch": 256, "microbatches": 8}  # compute-bound, seconds per round
PEER_ROUNDS, PEER_STEPS = 4, 2
STAGE_ROUNDS, STAGE_MIN_SECONDS = 9, 0.1  # StageStep's ratio: alternating rounds, the least seconds of a block
BACKWARD_ROUNDS, BACKWARDS_PER_ROUND = 40, 10  # StageStep's backward with and without inputs=


class Schedules:
    """Generating every stage's action list (pure Python), by each method package's generator."""

    params = (["gpipe", "1f1b", "pipedream", "interleaved"], [(4, 8), (16, 64)])
    param_names = ["schedule", "stages x microbatches"]

    def time_generate(self, name: str, size: tuple[int, int]) -> None:
        from methods.pipeline.flushed import schedules as flushed
        from methods.pipeline.pipedream.schedule import pipedream

        make = {"gpipe": flushed.gpipe, "1f1b": flushed.one_f_one_b, "pipedream": pipedream,
                "interleaved": lambda s, m: flushed.interleaved_1f1b(s // 2, 2, m)}[name]
        make(*size)


class VirtualStep:
    """One train_step of gpipe with 4 stages and 8 microbatches in the virtual executor (all stages in this
    process, one thread) on synthetic-mlp: the executor's Python overhead on a small model."""

    timeout = 120

    def setup(self) -> None:
        from _dist import context
        from harness.data.tensors import Batch, DataOrder

        torch.set_num_threads(1)
        cls, ctx = context("gpipe", 0, 1, {"stages": 4, "microbatches": 8, "batch_size": 128},
                           workload="synthetic-mlp")
        self.method = cls(ctx)
        order = DataOrder(len(ctx.workload.train), 128, seed=0)
        self.batch = Batch(0, 0.0, order.batch(0), ctx.workload.train, 0)
        for _ in range(3):
            self.method.train_step(self.batch)

    def time_gpipe_virtual_step(self) -> None:
        self.method.train_step(self.batch)


class StageStep:
    """One microbatch's forward and backward through a pipeline Stage (4 x Linear(512, 512), 32 rows, the last stage:
    the loss inside, one thread) against the same arithmetic as plain PyTorch (`(loss_fn(module(x), y) *
    scale).backward()`), in alternating blocks: the stage's own overhead (the saved-bytes hooks, the bookkeeping,
    autograd's call)."""

    timeout = 120

    def setup(self) -> None:
        from torch import nn

        from methods.pipeline.core.stage import Stage
        from methods.pipeline.core.versions import Live

        torch.set_num_threads(1)
        torch.manual_seed(0)
        module = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])
        stage = Stage(1, 2, module, torch.optim.SGD(module.parameters(), lr=0.0), Live(module),
                      nn.functional.cross_entropy)
        x, y = torch.randn(32, 512), torch.randint(0, 512, (32,))

        def ours() -> None:
            stage.forward((0, 0), x, y, 0.125)
            stage.backward((0, 0))

        def plain() -> None:
            leaf = x.detach().requires_grad_(True)
            (nn.functional.cross_entropy(module(leaf), y) * 0.125).backward()

        self.ours, self.plain, self.module = ours, plain, module

    def track_stage_vs_plain(self) -> float:
        """Stage forward + backward / plain PyTorch's (median of 9 alternating rounds); 1 is no overhead."""
        from _timing import interleaved_ratio

        return interleaved_ratio(self.ours, self.plain, rounds=STAGE_ROUNDS, min_seconds=STAGE_MIN_SECONDS)

    track_stage_vs_plain.unit = "x plain PyTorch"

    def track_backward_named_inputs_vs_none(self) -> float:
        """The backward alone of that graph with autograd's `inputs=` naming the parameters and the input, against
        the same call without (what Stage.backward does with the live weights): median of BACKWARD_ROUNDS (40)
        alternating rounds of BACKWARDS_PER_ROUND (10) backwards each. Above 1: naming them costs."""
        import time

        from torch import nn

        module, params = self.module, list(self.module.parameters())
        x, y = torch.randn(32, 512), torch.randint(0, 512, (32,))

        def backward(named: bool) -> float:
            leaf = x.detach().requires_grad_(True)
            loss = nn.functional.cross_entropy(module(leaf), y) * 0.125
            start = time.perf_counter()
            torch.autograd.backward(loss, inputs=[*params, leaf] if named else None)
            return time.perf_counter() - start

        for named in (True, False):
            backward(named)
        ratios = []
        for index in range(BACKWARD_ROUNDS):
            order = (True, False) if index % 2 == 0 else (False, True)
            seconds = {named: sum(backward(named) for _ in range(BACKWARDS_PER_ROUND)) for named in order}
            ratios.append(seconds[True] / seconds[False])
        return statistics.median(ratios)

    track_backward_named_inputs_vs_none.unit = "x without inputs="


class VersusTorchPipelining:
    """Our gpipe, 1f1b and interleaved-1f1b executors and torch's ScheduleGPipe / Schedule1F1B /
    ScheduleInterleaved1F1B on 2 gloo ranks x 1 thread, the same split, microbatches, loss and update, in alternating
    blocks in the same processes (setup_cache)."""

    timeout = 600

    def setup_cache(self) -> dict[str, float]:
        from pipeline_ranks import VARIANTS, pipeline_against_torch

        from _dist import spawn
        from harness.trace import ideal_bubble, step_bubble

        ranks = spawn(pipeline_against_torch, 2, PEER_ROUNDS, PEER_STEPS, *PEER_SIZES.values(), timeout=540)
        per_round = {name: [max(v) for v in zip(*(r[name] for r in ranks), strict=True)] for name in VARIANTS}
        out = {f"{kind}_ratio": statistics.median(o / t for o, t in zip(per_round[f"ours_{kind}"],
                                                                       per_round[f"torch_{kind}"], strict=True))
               for kind in ("gpipe", "1f1b", "interleaved")}
        for kind in ("gpipe", "interleaved"):
            out[f"{kind}_bubble"] = statistics.median(
                step_bubble(list(steps)) for steps in zip(*(r[f"{kind}_traces"] for r in ranks), strict=True))
        out["interleaved_bubble_excess"] = out["interleaved_bubble"] - ideal_bubble(2, PEER_SIZES["microbatches"], 2)
        return out

    def track_gpipe_vs_torch(self, cache: dict[str, float]) -> float:
        """Our gpipe step / torch's ScheduleGPipe step (median of per-round ratios); below 1 is faster."""
        return cache["gpipe_ratio"]

    track_gpipe_vs_torch.unit = "x torch ScheduleGPipe"

    def track_1f1b_vs_torch(self, cache: dict[str, float]) -> float:
        """Our 1f1b step / torch's Schedule1F1B step (median of per-round ratios); below 1 is faster."""
        return cache["1f1b_ratio"]

    track_1f1b_vs_torch.unit = "x torch Schedule1F1B"

    def track_interleaved_vs_torch(self, cache: dict[str, float]) -> float:
        """Our interleaved-1f1b step / torch's ScheduleInterleaved1F1B step; below 1 is faster."""
        return cache["interleaved_ratio"]

    track_interleaved_vs_torch.unit = "x torch ScheduleInterleaved1F1B"

    def track_gpipe_bubble(self, cache: dict[str, float]) -> float:
        """The measured gpipe bubble (S=2, M=8: the ideal is 1/9 = 0.111); smaller is better."""
        return cache["gpipe_bubble"]

    track_gpipe_bubble.unit = "fraction of the step"

    def track_interleaved_bubble_excess(self, cache: dict[str, float]) -> float:
        """The measured interleaved-1f1b bubble minus its theory (p-1)/(v·M+p-1) = 1/17 (p=2, v=2, M=8)."""
        return cache["interleaved_bubble_excess"]

    track_interleaved_bubble_excess.unit = "fraction of the step"
