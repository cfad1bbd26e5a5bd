"""Pipeline schedules as data: for every worker (rank), the ordered list of actions it runs, made by pure generators."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from harness.trace import COMPUTE_OPS


class Op(str, Enum):
    """What a stage does. Sends and receives name the microbatch whose tensor travels."""

    RECV_ACT = "recv_act"       # activation of microbatch mb from stage s-1
    FORWARD = "forward"
    SEND_ACT = "send_act"       # to stage s+1
    RECV_GRAD = "recv_grad"     # gradient w.r.t. this stage's output, from stage s+1
    BACKWARD = "backward"
    SEND_GRAD = "send_grad"     # gradient w.r.t. this stage's input, to stage s-1
    SYNC_GRADS = "sync_grads"   # all-reduce of the stage's weight gradients among its replicas (mb: the round)
    UPDATE = "update"           # optimizer step on the accumulated gradients (advances the weight version)


SHORT = {Op.RECV_ACT: "rA", Op.FORWARD: "F", Op.SEND_ACT: "sA", Op.RECV_GRAD: "rG", Op.BACKWARD: "B",
         Op.SEND_GRAD: "sG", Op.SYNC_GRADS: "S", Op.UPDATE: "U"}
COMPUTE = tuple(op for op in Op if op.value in COMPUTE_OPS)
RECEIVES = (Op.RECV_ACT, Op.RECV_GRAD)
SENDS = (Op.SEND_ACT, Op.SEND_GRAD)


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one stage. `mb` is the microbatch within an iteration (GPipe, 1F1B), or the global minibatch number
    in an asynchronous pipeline (PipeDream); the round for SYNC_GRADS; None for UPDATE. `iteration` tells apart the
    microbatches of several iterations in flight (0 when a schedule keeps one). Printed as torch.distributed.pipelining
    prints its IR, stage first: '0F3', '2B1', '1U'; '0F3@2' for iteration 2."""

    op: Op
    stage: int = 0
    mb: int | None = None
    iteration: int = 0

    def __str__(self) -> str:
        text = f"{self.stage}{SHORT[self.op]}{'' if self.mb is None else self.mb}"
        return text + (f"@{self.iteration}" if self.iteration else "")

    @property
    def key(self) -> tuple[int, int | None]:
        """(iteration, microbatch): what identifies the data an action works on, within its stage."""
        return (self.iteration, self.mb)


Schedule = list[list[Action]]  # schedule[w] is worker w's ordered action list (a worker is a rank, or a stage)


def _check(stages: int, microbatches: int) -> None:
    if stages < 1:
        raise ValueError(f"a pipeline needs at least one stage, got {stages}")
    if microbatches < 1:
        raise ValueError(f"a pipeline needs at least one microbatch, got {microbatches}")


def forward_unit(stage: int, stages: int, mb: int, iteration: int = 0) -> list[Action]:
    """Receive the input (unless first), run the forward, send the output on (unless last)."""
    out = [Action(Op.RECV_ACT, stage, mb, iteration)] if stage > 0 else []
    out.append(Action(Op.FORWARD, stage, mb, iteration))
    if stage < stages - 1:
        out.append(Action(Op.SEND_ACT, stage, mb, iteration))
    return out


def backward_unit(stage: int, stages: int, mb: int, iteration: int = 0) -> list[Action]:
    """Receive the output gradient (unless last), run the backward, send the input gradient back (unless first)."""
    out = [Action(Op.RECV_GRAD, stage, mb, iteration)] if stage < stages - 1 else []
    out.append(Action(Op.BACKWARD, stage, mb, iteration))
    if stage > 0:
        out.append(Action(Op.SEND_GRAD, stage, mb, iteration))
    return out


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe (Huang et al. 2019), one list per stage: every stage runs all M forwards, then all M backwards (in
    microbatch order, as torch.distributed.pipelining's ScheduleGPipe does), then one update: a flush every
    minibatch."""
    _check(stages, microbatches)
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
    _check(stages, microbatches)
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
    _check(ranks * chunks, microbatches)
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
    _check(stages, 1)
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
    _check(stages, minibatches)
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
    _check(stages, 1)
    actions: list[Action] = []
    forward = t - stage
    if 0 <= forward < samples:
        actions += forward_unit(stage, stages, forward)
    backward = t - pb_delay(stage, stages) - stage
    if 0 <= backward < samples:
        actions += backward_unit(stage, stages, backward) + [Action(Op.UPDATE, stage)]
    return actions


def compute_order(schedule: Schedule) -> list[list[str]]:
    """Each worker's forwards, backwards and updates in order, as torch prints its IR ('0F0', '1B2', '0U')."""
    return [[str(a) for a in actions if a.op in COMPUTE] for actions in schedule]
