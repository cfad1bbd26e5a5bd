"""APapo's multi-iteration 1F1B over the IR (core/actions.py): per-stage delays, gated forwards, updates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from harness.schedule.ir import Action, Op, Schedule, backward_unit, forward_unit


def version_delay(stages: int, iterations_in_flight: int) -> int:
    """D: how many updates older than the newest a microbatch's weights may be. K iterations in flight use weights
    K-1 versions old (K = 2: PipeDream-2BW's double buffering, delay 1); K = 1 is a flush. A single stage never has
    two iterations in flight (its 1F1B bound is one microbatch), so its delay is 0: it is SGD with accumulation."""
    if iterations_in_flight < 1:
        raise ValueError(f"iterations_in_flight must be >= 1, got {iterations_in_flight}")
    return 0 if stages == 1 else iterations_in_flight - 1


DelayRule = Literal["uniform", "per_stage"]


def version_delays(stages: int, microbatches: int, iterations_in_flight: int, rule: DelayRule = "uniform"
                   ) -> tuple[int, ...]:
    """Each stage's delay D_s (weights D_s versions old), never more than K - 1:

        uniform    D_s = K - 1 at every stage (PipeDream-2BW; 0 with one stage)
        per_stage  D_s = min(K - 1, ceil((S - 1 - s) / M)): the least delay at which the version gate never holds
                   stage s's forwards back beyond 1F1B's own bound (g(u) = u - (S - s) for every u needs
                   M·D_s >= S - 1 - s). The last stage has none: its backward of an iteration's last microbatch
                   comes right after the forward, so the update is done before the next iteration's first forward.

    The delays never grow with s, which keeps every stage's gate at or past the one before it (segment relies on
    it). With M >= S - 1 per_stage is D = (1, ..., 1, 0): the delays PipeDream's weight stashing has at two stages."""
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    most = version_delay(stages, iterations_in_flight)
    if rule == "uniform":
        return (most,) * stages
    if rule == "per_stage":
        return tuple(min(most, -(-(stages - 1 - s) // microbatches)) for s in range(stages))
    raise ValueError(f"unknown delay rule {rule!r}: 'uniform' or 'per_stage'")


def version_of(microbatch: int, microbatches: int, delay: int) -> int:
    """The weight version (updates applied) the forward and the backward of global microbatch u use: iteration
    t = u // M uses version max(0, t - D). D = 1: PipeDream-2BW's max(floor(k/m) - 1, 0)."""
    return max(0, microbatch // microbatches - delay)


def gate(microbatch: int, stage: int, stages: int, microbatches: int, delay: int) -> int:
    """The backward after which stage s, whose delay is D, may run the forward of global microbatch u (-1: from the
    start):

        g(u) = max( u - (S - s),            1F1B: at most S - s microbatches in flight at stage s
                    M (t - D) - 1 )         the update of iteration t - D - 1, which makes version t - D, is done

    with t = u // M. Both terms grow with s (D_s never grows with s: version_delays), so a later stage has always
    run at least the backwards an earlier one has when both reach the same forward: the per-stage lists agree (the
    Interleaver checks it)."""
    t = microbatch // microbatches
    return max(-1, microbatch - (stages - stage), microbatches * (t - delay) - 1)


def _backward(stage: int, stages: int, v: int, microbatches: int) -> list[Action]:
    t = v // microbatches
    out = [Action(a.op, a.stage, a.mb, t) for a in backward_unit(stage, stages, v)]
    if v % microbatches == microbatches - 1:
        out.append(Action(Op.UPDATE, stage, None, t))
    return out


def _forward(stage: int, stages: int, u: int, microbatches: int) -> list[Action]:
    return [Action(a.op, a.stage, a.mb, u // microbatches) for a in forward_unit(stage, stages, u)]


def _raw_segment(stage: int, stages: int, microbatches: int, delay: int, iteration: int) -> list[Action]:
    m, s, d = microbatches, stage, delay
    first, after = iteration * m, (iteration + 1) * m
    out: list[Action] = []
    u = first
    v = gate(first, s, stages, m, d)
    while True:
        while u < after and gate(u, s, stages, m, d) <= v:
            out += _forward(s, stages, u, m)
            u += 1
        if gate(after, s, stages, m, d) <= v:
            return out
        v += 1
        out += _backward(s, stages, v, m)


def segment(stage: int, stages: int, microbatches: int, delays: Sequence[int], iteration: int) -> list[Action]:
    """Stage s's actions in runner step t (delays: every stage's D_s, version_delays): from the forward of
    iteration t's first microbatch up to (not including) that of iteration t+1. In the whole run's order each
    backward B(v) is followed by the forwards F(u) with g(u) = v (after B(-1): the start), and the last backward of
    an iteration by its update. A microbatch is named by its global number u = t·M + j, its iteration t = u // M
    (so '0F5@1' is microbatch 1 of iteration 1 with M = 4). The forwards of iteration t all run in step t; the
    backwards of earlier iterations may too.

    No message crosses a step: a stage sends the gradient of v in the step where stage s-1 runs the backward of v
    (at the step's start when its own backward of v ran in an earlier step), so every step's sends are received
    in it, and nothing is in flight while the runner evaluates between steps."""
    out = _raw_segment(stage, stages, microbatches, delays[stage], iteration)
    if stage == 0:
        return out
    m, t, before = microbatches, iteration, delays[stage - 1]
    received_by = gate((t + 1) * m, stage - 1, stages, m, before)  # stage s-1's last backward in steps <= t
    out = [a for a in out if not (a.op is Op.SEND_GRAD and a.mb > received_by)]
    sent_before = gate(t * m, stage, stages, m, delays[stage])  # this stage's last backward in steps < t
    held = range(gate(t * m, stage - 1, stages, m, before) + 1, min(received_by, sent_before) + 1)
    return [Action(Op.SEND_GRAD, stage, v, v // m) for v in held] + out


def apapo_drain(stage: int, stages: int, microbatches: int, delays: Sequence[int], iterations: int) -> list[Action]:
    """After `iterations` steps: the backwards (and updates) still due at stage s, so every iteration is applied,
    after the gradient sends held back for them."""
    last = gate(iterations * microbatches, stage, stages, microbatches, delays[stage])
    held = []
    if stage > 0:
        receiver_last = gate(iterations * microbatches, stage - 1, stages, microbatches, delays[stage - 1])
        held = [Action(Op.SEND_GRAD, stage, v, v // microbatches) for v in range(receiver_last + 1, last + 1)]
    return held + [a for v in range(last + 1, iterations * microbatches)
                   for a in _backward(stage, stages, v, microbatches)]


def apapo(stages: int, microbatches: int, iterations_in_flight: int, iterations: int, rule: DelayRule = "uniform"
          ) -> Schedule:
    """A whole run of `iterations` iterations, one list per stage: every step's segment, then the drain."""
    d = version_delays(stages, microbatches, iterations_in_flight, rule)
    return [[a for t in range(iterations) for a in segment(s, stages, microbatches, d, t)]
            + apapo_drain(s, stages, microbatches, d, iterations) for s in range(stages)]
