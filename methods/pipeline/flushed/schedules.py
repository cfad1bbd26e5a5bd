"""The flushed schedules as pure generators over the IR (core/actions.py): GPipe, 1F1B, interleaved 1F1B, ZB-H1."""

from __future__ import annotations

from harness.schedule.ir import (
    Action,
    Op,
    Schedule,
    backward_unit,
    check_shape,
    forward_unit,
    input_backward_unit,
)


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe (Huang et al. 2019), one list per stage: every stage runs all M forwards, then all M backwards (in
    microbatch order, as torch.distributed.pipelining's ScheduleGPipe does), then one update: a flush every
    minibatch."""
    check_shape(stages, microbatches)
    schedule = []
    for s in range(stages):
        actions = [a for m in range(microbatches) for a in forward_unit(s, stages, m)]
        actions += [a for m in range(microbatches) for a in backward_unit(s, stages, m)]
        schedule.append(actions + [Action(Op.UPDATE, s)])
    return schedule


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B with a flush (PipeDream-Flush, Narayanan et al. 2021), one list per stage: stage s runs min(S-1-s, M)
    warm-up forwards, then alternates one forward and one backward, then cools down with the remaining backwards,
    then one update."""
    check_shape(stages, microbatches)
    schedule = []
    for s in range(stages):
        warmup = min(stages - 1 - s, microbatches)
        actions = [a for m in range(warmup) for a in forward_unit(s, stages, m)]
        for k in range(microbatches - warmup):
            actions += forward_unit(s, stages, warmup + k) + backward_unit(s, stages, k)
        for m in range(microbatches - warmup, microbatches):
            actions += backward_unit(s, stages, m)
        schedule.append(actions + [Action(Op.UPDATE, s)])
    return schedule


def interleaved_1f1b(ranks: int, chunks: int, microbatches: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., SC 2021, section 2.2; torch's ScheduleInterleaved1F1B), one list per rank.

    Rank r holds the v = `chunks` stages r, r + p, ..., r + (v-1)p of S = v·p. Microbatches go in rounds of
    mpr = M / max(1, M // p) (M must be a multiple of the round count). Rank r runs
    warm-up = min((v-1)·mpr + 2(p-1-r), v·M) forwards, then alternates one forward and one backward, then the
    remaining backwards; forward number k runs chunk (k // mpr) mod v, backward number k chunk v-1 - (k // mpr) mod v,
    each chunk's microbatches in order. Then one update per local stage. The bubble is (p-1)/(v·M + p-1).
    """
    check_shape(ranks * chunks, microbatches)
    if chunks < 1:
        raise ValueError(f"interleaved 1F1B needs at least one stage per rank, got {chunks}")
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise ValueError(f"interleaved 1F1B: {microbatches} microbatches do not split into rounds of "
                         f"{microbatches // rounds} on {ranks} ranks (make M a multiple of the rank count)")
    per_round = microbatches // rounds
    stages = ranks * chunks
    schedule = []
    for r in range(ranks):
        done = {"F": [0] * chunks, "B": [0] * chunks}  # per local chunk: microbatches run forward / backward
        actions: list[Action] = []
        for kind, chunk in _interleaved_order(r, ranks, chunks, microbatches, per_round):
            stage, mb = chunk * ranks + r, done[kind][chunk]
            actions += forward_unit(stage, stages, mb) if kind == "F" else backward_unit(stage, stages, mb)
            done[kind][chunk] += 1
        schedule.append(actions + [Action(Op.UPDATE, c * ranks + r) for c in range(chunks)])
    return schedule


def _interleaved_order(rank: int, ranks: int, chunks: int, microbatches: int, per_round: int) -> list[tuple[str, int]]:
    """Rank `rank`'s compute order in interleaved 1F1B as (F or B, local chunk): warm-up forwards, then one forward
    and one backward in turn, then the remaining backwards."""
    total = chunks * microbatches
    warmup = min((chunks - 1) * per_round + 2 * (ranks - 1 - rank), total)

    def forward(k: int) -> tuple[str, int]:
        return ("F", (k // per_round) % chunks)

    def backward(k: int) -> tuple[str, int]:
        return ("B", chunks - 1 - (k // per_round) % chunks)

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    return order + [backward(k) for k in range(total - warmup, total)]


def zb_h1(stages: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 3.1), one list per stage: 1F1B's order
    with each backward split into B (the gradient w.r.t. the stage input, which the stage before waits for) and W
    (the weight gradient, which nobody waits for). Stage s runs each W up to s backwards after its B: the stages
    near the loss send their input gradients on without the W in between, so the cool-down's chain of B passes is
    one B per stage instead of B + W, and the deferred W passes fill the idle time that leaves. Deferring s W
    passes at stage s holds at most S - s + s = S microbatches there, 1F1B's peak (at stage 0), so the memory does
    not grow. The bubble is (S-1)(T_F + T_B - T_W) against 1F1B's (S-1)(T_F + T_B + T_W)."""
    check_shape(stages, microbatches)
    schedule = []
    for s in range(stages):
        warmup = min(stages - 1 - s, microbatches)
        actions = [a for m in range(warmup) for a in forward_unit(s, stages, m)]
        pending: list[int] = []  # microbatches whose B ran and whose W waits
        for k in range(microbatches - warmup):
            actions += forward_unit(s, stages, warmup + k) + _b_then_due_w(s, stages, k, pending)
        for m in range(microbatches - warmup, microbatches):
            actions += _b_then_due_w(s, stages, m, pending)
        actions += [Action(Op.BACKWARD_WEIGHT, s, m) for m in pending]
        schedule.append(actions + [Action(Op.UPDATE, s)])
    return schedule


def _b_then_due_w(stage: int, stages: int, mb: int, pending: list[int]) -> list[Action]:
    """ZB-H1 at `stage`: the B of microbatch mb (with its receive and send), then the W passes that would otherwise
    be more than `stage` backwards late (oldest first); `pending` holds the microbatches whose W waits."""
    pending.append(mb)
    out = input_backward_unit(stage, stages, mb)
    while len(pending) > stage:
        out.append(Action(Op.BACKWARD_WEIGHT, stage, pending.pop(0)))
    return out
