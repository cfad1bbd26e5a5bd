"""Action orders of the pipelines the projection can re-shape (gpipe, 1f1b, pipedream), one list per stage, and
their tasks with per-stage costs: what a schedule looks like at a world size no run had."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.project.simulate import Task

#: Methods whose order the projection can generate for any number of stages (one stage per rank).
GENERATED = ("gpipe", "1f1b", "pipedream")


def forward_ops(stage: int, stages: int, mb: int) -> list[tuple[str, int]]:
    """recv_act (not on the first stage), forward, send_act (not on the last) of one microbatch."""
    return ([("recv_act", mb)] if stage > 0 else []) + [("forward", mb)] + (
        [("send_act", mb)] if stage < stages - 1 else [])


def backward_ops(stage: int, stages: int, mb: int) -> list[tuple[str, int]]:
    """recv_grad (not on the last stage), backward, send_grad (not on the first) of one microbatch."""
    return ([("recv_grad", mb)] if stage < stages - 1 else []) + [("backward", mb)] + (
        [("send_grad", mb)] if stage > 0 else [])


def gpipe_order(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """GPipe: every forward, then every backward in microbatch order, then the update (mb -1)."""
    ops = [op for mb in range(microbatches) for op in forward_ops(stage, stages, mb)]
    ops += [op for mb in range(microbatches) for op in backward_ops(stage, stages, mb)]
    return ops + [("update", -1)]


def one_f_one_b_order(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B (PipeDream-Flush): min(S-1-s, M) warm-up forwards, then one forward and one backward in turn, then the
    remaining backwards, then the update."""
    warmup = min(stages - 1 - stage, microbatches)
    ops = [op for mb in range(warmup) for op in forward_ops(stage, stages, mb)]
    for k in range(microbatches - warmup):
        ops += forward_ops(stage, stages, warmup + k) + backward_ops(stage, stages, k)
    for mb in range(microbatches - warmup, microbatches):
        ops += backward_ops(stage, stages, mb)
    return ops + [("update", -1)]


def pipedream_order(stage: int, stages: int, tick: int) -> list[tuple[str, int]]:
    """A PipeDream tick t at stage s in the steady state: forward(t), backward(t - (S-1-s)), update."""
    return forward_ops(stage, stages, tick) + backward_ops(stage, stages, tick - (stages - 1 - stage)) + [
        ("update", -1)]


@dataclass(frozen=True)
class StageCosts:
    """One stage's costs per microbatch: forward, backward and update seconds, a send's local seconds, and
    output_bytes, the activation it sends forward (its gradient comes back with the same size)."""

    forward_s: float
    backward_s: float
    update_s: float
    send_s: float
    output_bytes: float


def pipeline_tasks(method: str, stages: Sequence[StageCosts], microbatches: int, steps: int) -> list[list[Task]]:
    """Per rank (one stage each), the tasks of `steps` consecutive steps of a generated order. Microbatch ids run
    on across steps (step r's microbatch m is r·M + m; a pipedream tick is one minibatch), so messages never mix
    steps. A receive's bytes are its message's; a send_grad of stage s carries the size of stage s-1's output."""
    if method not in GENERATED:
        raise ValueError(f"no generated order for {method!r} (known: {', '.join(GENERATED)})")
    count = len(stages)
    shift = 1 if method == "pipedream" else microbatches
    ranks: list[list[Task]] = []
    for s, cost in enumerate(stages):
        tasks = []
        for step in range(steps):
            if method == "pipedream":
                ops = pipedream_order(s, count, step)
            elif method == "gpipe":
                ops = gpipe_order(s, count, microbatches)
            else:
                ops = one_f_one_b_order(s, count, microbatches)
            for op, mb in ops:
                tasks.append(_task(op, s, mb if mb < 0 or method == "pipedream" else mb + step * shift, step,
                                   cost, stages))
        ranks.append(tasks)
    return ranks


def _task(op: str, stage: int, mb: int, step: int, cost: StageCosts, stages: Sequence[StageCosts]) -> Task:
    duration = {"forward": cost.forward_s, "backward": cost.backward_s, "update": cost.update_s,
                "send_act": cost.send_s, "send_grad": cost.send_s}.get(op, 0.0)
    nbytes = {"send_act": cost.output_bytes, "send_grad": stages[stage - 1].output_bytes if stage else 0.0}.get(op, 0.0)
    return Task(op, stage, mb, duration, nbytes, step=step)
