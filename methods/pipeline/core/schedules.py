"""Every pipeline schedule, as pure generators over the IR (core/actions.py): GPipe, 1F1B, interleaved 1F1B,
PipeDream's ticks, Pipelined Backpropagation's ticks, APapo's multi-iteration segments and Q-FB's windows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from methods.pipeline.core.actions import Action, Op, Schedule, backward_unit, check_shape, forward_unit

Sync = Literal["exact", "bounded", "ahead"]


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


def pipedream_delay(stage: int, stages: int) -> int:
    """Minibatches in flight ahead of a backward at `stage` in PipeDream's 1F1B: the forward of minibatch t and its
    backward there are S-1-s ticks apart."""
    return stages - 1 - stage


def pipedream_tick(stage: int, stages: int, t: int, replicas: int = 1, last: int | None = None) -> list[Action]:
    """Tick t of PipeDream's asynchronous 1F1B (Narayanan et al., SOSP 2019) at `stage`: the forward of minibatch t,
    then, once the warm-up of S-1-s forwards is over, the backward of minibatch b = t-(S-1-s), then the update. There
    is no flush: ticks follow each other for the whole run.

    With `replicas` = r > 1 (1F1B-RR: minibatch t goes to replica t mod r) the r replicas update together, once per
    round of r minibatches: after the backward of the round's last minibatch (or of minibatch `last`, the run's last,
    which closes a partial round) comes SYNC_GRADS (their all-reduce) and the update. `place` sends each action to its
    replica."""
    check_shape(stages, 1)
    actions = forward_unit(stage, stages, t)
    done = t - pipedream_delay(stage, stages)
    if done >= 0:
        actions += backward_unit(stage, stages, done) + _round_end(stage, done, replicas, last)
    return actions


def _round_end(stage: int, done: int, replicas: int, last: int | None) -> list[Action]:
    """The update after the backward of minibatch `done` (with the replicas' sync when the round is complete)."""
    if replicas == 1:
        return [Action(Op.UPDATE, stage)]
    if done % replicas == replicas - 1 or done == last:
        return [Action(Op.SYNC_GRADS, stage, done // replicas), Action(Op.UPDATE, stage)]
    return []


def pipedream_drain(stage: int, stages: int, ticks: int, replicas: int = 1) -> list[Action]:
    """The cool-down after `ticks` ticks: the backward and update of every minibatch still in flight at `stage`."""
    first = max(0, ticks - pipedream_delay(stage, stages))
    actions = [a for t in range(first, ticks)
               for a in backward_unit(stage, stages, t) + _round_end(stage, t, replicas, ticks - 1)]
    if first == ticks and ticks > 0:  # every backward ran in the ticks: close the partial round they left open
        done = ticks - 1
        if replicas > 1 and done % replicas != replicas - 1:
            actions += _round_end(stage, done, replicas, done)
    return actions


def pipedream(stages: int, minibatches: int) -> Schedule:
    """A whole PipeDream run of N minibatches, one list per stage: N ticks, then the drain."""
    check_shape(stages, minibatches)
    return [[a for t in range(minibatches) for a in pipedream_tick(s, stages, t)]
            + pipedream_drain(s, stages, minibatches) for s in range(stages)]


def pb_delay(stage: int, stages: int) -> int:
    """Updates between a sample's forward and its backward at `stage` in fine-grained Pipelined Backpropagation:
    D_s = 2(S-1-s). A sample moves one stage per tick, forward then back, and every tick each stage updates once, so at
    stage s its forward (tick i+s) and backward (tick i+2(S-1)-s) are 2(S-1-s) ticks apart; twice PipeDream's S-1-s,
    where a stage alternates forwards and backwards."""
    return 2 * (stages - 1 - stage)


def pb_tick(stage: int, stages: int, t: int, samples: int) -> list[Action]:
    """Tick t of Pipelined Backpropagation (Kosson et al., MLSys 2021) at `stage`: the forward of sample t-s (the
    newest to reach this stage), then the backward of sample t-2(S-1)+s (the oldest whose gradient has come back),
    then the update. `samples` = how many samples entered the pipeline (ticks at or past it only drain: no forward of a
    sample >= samples). Every message is received on the tick after it was sent."""
    check_shape(stages, 1)
    actions: list[Action] = []
    forward = t - stage
    if 0 <= forward < samples:
        actions += forward_unit(stage, stages, forward)
    backward = t - pb_delay(stage, stages) - stage
    if 0 <= backward < samples:
        actions += backward_unit(stage, stages, backward) + [Action(Op.UPDATE, stage)]
    return actions



# -- APapo (multi-iteration asynchronous 1F1B) ----------------------------------------------------------------
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


# -- Q-FB (windows) ------------------------------------------------------------------------------------------
def qfb_tick(stage: int, stages: int, microbatches: int, window: int, sync: Sync) -> list[Action]:
    """Stage `stage`'s actions in runner step `window`.

    exact: the forwards and the backwards of window t, merged as 1F1B merges them (S-1-s forwards first; the order
        one lane would run them in), then the update. The lanes split the list by op (methods/pipeline/qfb/lanes.py).
    bounded: the forwards of window t and the backwards of window t-1 (none at t = 0), one of each in turn, then the
        update of window t-1; `qfb_drain` runs the backwards and update of the last window.
    Microbatch m of window t is Action(..., mb=m, iteration=t)."""
    exact = sync == "exact"
    backward_window = window if exact else window - 1
    warmup = min(stages - 1 - stage, microbatches) if exact else 0
    forwards = [forward_unit(stage, stages, m, window) for m in range(microbatches)]
    backwards = [backward_unit(stage, stages, m, backward_window) for m in range(microbatches)] \
        if backward_window >= 0 else []
    actions = [a for unit in forwards[:warmup] for a in unit]
    for k in range(max(len(forwards) - warmup, len(backwards))):
        actions += forwards[warmup + k] if warmup + k < len(forwards) else []
        actions += backwards[k] if k < len(backwards) else []
    return actions + ([Action(Op.UPDATE, stage)] if backwards else [])


def qfb_drain(stage: int, stages: int, microbatches: int, last_window: int) -> list[Action]:
    """bounded: the backwards and update of the last window, after the last step."""
    return [a for m in range(microbatches) for a in backward_unit(stage, stages, m, last_window)] + [
        Action(Op.UPDATE, stage)]


# -- Q-FB's prototype reading (sync = "ahead"): the forward lane runs ahead of the backward lane through a bounded
# buffer, an update every M backwards, no flush. A stage's whole run is one list,
#     F(0) .. F(L-1), then for j = 0, 1, ...: B(j), U if (j+1) % M == 0, F(j+L)
# over microbatches n counted across the run (n = window·M + mb), with the lead L = ahead_lead(...); runner step t
# runs the part from F(tM) up to F(tM+M), and the drain the last L-1 backwards.
def ahead_lead(stage: int, stages: int, buffer: int) -> int:
    """How many forwards stage `stage` runs ahead of its backwards: `buffer` (the prototype's queue) at every stage
    but the last, 1 at the last (it runs each microbatch's backward right after its forward)."""
    return 1 if stage == stages - 1 else buffer


def ahead_version(n: int, lead: int, microbatches: int) -> int:
    """The weight version (updates applied) the forward of microbatch n uses under sync = "ahead": the updates
    before it in the stage's list, one after every M-th backward up to B(n - lead)."""
    return max(0, (n - lead + 1) // microbatches)


def _ahead_backward(stage: int, stages: int, microbatches: int, j: int) -> list[Action]:
    unit = backward_unit(stage, stages, j % microbatches, j // microbatches)
    return unit + ([Action(Op.UPDATE, stage)] if (j + 1) % microbatches == 0 else [])


def qfb_ahead_tick(stage: int, stages: int, microbatches: int, window: int, buffer: int) -> list[Action]:
    """sync = "ahead": stage `stage`'s actions in runner step `window`: each forward of the window, followed by the
    backward (and update) that the lead lets through; microbatch n is Action(..., mb=n % M, iteration=n // M)."""
    lead, actions = ahead_lead(stage, stages, buffer), []
    for n in range(window * microbatches, (window + 1) * microbatches):
        actions += forward_unit(stage, stages, n % microbatches, n // microbatches)
        if n - lead + 1 >= 0:
            actions += _ahead_backward(stage, stages, microbatches, n - lead + 1)
    return actions


def qfb_ahead_drain(stage: int, stages: int, microbatches: int, last_window: int, buffer: int) -> list[Action]:
    """sync = "ahead": after the last step, the backwards the lead held back (the last L - 1) and their update."""
    end = (last_window + 1) * microbatches
    first = max(0, end - ahead_lead(stage, stages, buffer) + 1)
    return [a for j in range(first, end) for a in _ahead_backward(stage, stages, microbatches, j)]
