"""Pipeline schedules as data: for every stage, the ordered list of actions it runs, made by pure generators."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class Op(str, Enum):
    """What a stage does. Sends and receives name the microbatch whose tensor travels."""

    RECV_ACT = "recv_act"     # activation of microbatch mb from stage s-1
    FORWARD = "forward"
    SEND_ACT = "send_act"     # to stage s+1
    RECV_GRAD = "recv_grad"   # gradient w.r.t. this stage's output, from stage s+1
    BACKWARD = "backward"
    SEND_GRAD = "send_grad"   # gradient w.r.t. this stage's input, to stage s-1
    UPDATE = "update"         # optimizer step on the accumulated gradients (advances the weight version)


_SHORT = {Op.RECV_ACT: "rA", Op.FORWARD: "F", Op.SEND_ACT: "sA", Op.RECV_GRAD: "rG", Op.BACKWARD: "B",
          Op.SEND_GRAD: "sG", Op.UPDATE: "U"}
COMPUTE = (Op.FORWARD, Op.BACKWARD, Op.UPDATE)


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one stage. `mb` is the microbatch within a flushed minibatch (GPipe, 1F1B) or the global minibatch
    number in an asynchronous pipeline (PipeDream); None for UPDATE."""

    op: Op
    mb: int | None = None

    def __str__(self) -> str:
        return _SHORT[self.op] + ("" if self.mb is None else str(self.mb))


Schedule = list[list[Action]]  # schedule[s] is stage s's ordered action list


def _check(stages: int, microbatches: int) -> None:
    if stages < 1:
        raise ValueError(f"a pipeline needs at least one stage, got {stages}")
    if microbatches < 1:
        raise ValueError(f"a pipeline needs at least one microbatch, got {microbatches}")


def forward_unit(stage: int, stages: int, mb: int) -> list[Action]:
    """Receive the input (unless first), run the forward, send the output on (unless last)."""
    out = [Action(Op.RECV_ACT, mb)] if stage > 0 else []
    out.append(Action(Op.FORWARD, mb))
    if stage < stages - 1:
        out.append(Action(Op.SEND_ACT, mb))
    return out


def backward_unit(stage: int, stages: int, mb: int) -> list[Action]:
    """Receive the output gradient (unless last), run the backward, send the input gradient back (unless first)."""
    out = [Action(Op.RECV_GRAD, mb)] if stage < stages - 1 else []
    out.append(Action(Op.BACKWARD, mb))
    if stage > 0:
        out.append(Action(Op.SEND_GRAD, mb))
    return out


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe (Huang et al. 2019): every stage runs all M forwards, then all M backwards (in microbatch order, as
    torch.distributed.pipelining's ScheduleGPipe does), then one update: a flush every minibatch."""
    _check(stages, microbatches)
    schedule = []
    for s in range(stages):
        actions = [a for m in range(microbatches) for a in forward_unit(s, stages, m)]
        actions += [a for m in range(microbatches) for a in backward_unit(s, stages, m)]
        schedule.append(actions + [Action(Op.UPDATE)])
    return schedule


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B with a flush (PipeDream-Flush, Narayanan et al. 2021): stage s runs min(S-1-s, M) warm-up forwards, then
    alternates one forward and one backward, then cools down with the remaining backwards, then one update."""
    _check(stages, microbatches)
    schedule = []
    for s in range(stages):
        warmup = min(stages - 1 - s, microbatches)
        actions = [a for m in range(warmup) for a in forward_unit(s, stages, m)]
        for k in range(microbatches - warmup):
            actions += forward_unit(s, stages, warmup + k) + backward_unit(s, stages, k)
        for m in range(microbatches - warmup, microbatches):
            actions += backward_unit(s, stages, m)
        schedule.append(actions + [Action(Op.UPDATE)])
    return schedule


def pipedream_delay(stage: int, stages: int) -> int:
    """Minibatches in flight ahead of a backward at `stage` in PipeDream's 1F1B: the forward of minibatch t and its
    backward there are S-1-s ticks (and as many weight updates) apart."""
    return stages - 1 - stage


def pipedream_tick(stage: int, stages: int, t: int) -> list[Action]:
    """Tick t of PipeDream's asynchronous 1F1B (Narayanan et al., SOSP 2019) at `stage`: the forward of minibatch t,
    then, once the warm-up of S-1-s forwards is over, the backward of minibatch t-(S-1-s) and an update. There is
    no flush: ticks follow each other for the whole run."""
    _check(stages, 1)
    actions = forward_unit(stage, stages, t)
    done = t - pipedream_delay(stage, stages)
    if done >= 0:
        actions += backward_unit(stage, stages, done) + [Action(Op.UPDATE)]
    return actions


def pipedream_drain(stage: int, stages: int, ticks: int) -> list[Action]:
    """The cool-down after `ticks` ticks: the backward and update of every minibatch still in flight at `stage`."""
    first = max(0, ticks - pipedream_delay(stage, stages))
    return [a for t in range(first, ticks) for a in backward_unit(stage, stages, t) + [Action(Op.UPDATE)]]


def pipedream(stages: int, minibatches: int) -> Schedule:
    """A whole PipeDream run of N minibatches: N ticks, then the drain."""
    _check(stages, minibatches)
    return [[a for t in range(minibatches) for a in pipedream_tick(s, stages, t)]
            + pipedream_drain(s, stages, minibatches) for s in range(stages)]


def compute_order(schedule: Schedule) -> list[list[str]]:
    """Each stage's forwards, backwards and updates in order, as short strings ("F0", "B0", "U")."""
    return [[str(a) for a in actions if a.op in COMPUTE] for actions in schedule]


class Deadlock(RuntimeError):
    """Raised when no stage can make progress: every one is waiting for a message that is never sent."""


def peer_message(stage: int, action: Action) -> tuple[str, int, int, int] | None:
    """The message a send or receive handles, as (kind, src, dst, mb); None for a compute action."""
    if action.op in (Op.SEND_ACT, Op.RECV_ACT):
        src = stage if action.op is Op.SEND_ACT else stage - 1
        return ("act", src, src + 1, action.mb)
    if action.op in (Op.SEND_GRAD, Op.RECV_GRAD):
        src = stage if action.op is Op.SEND_GRAD else stage + 1
        return ("grad", src, src - 1, action.mb)
    return None


@dataclass
class Interleaver:
    """Runs every stage's action list in one thread, in an order that respects the messages: a stage runs until its
    next action is a receive whose message has not been sent yet, then the next stage gets a turn.

    `run(stage, action)` does the work; messages in flight persist across calls to `advance`, so an asynchronous
    schedule can be fed tick by tick. With a no-op `run`, it checks a schedule for deadlocks and unmatched messages.
    """

    stages: int

    def __post_init__(self) -> None:
        self.in_flight: set[tuple[str, int, int, int]] = set()

    def advance(self, schedule: Schedule, run: Callable[[int, Action], None] = lambda s, a: None) -> list[
            tuple[int, Action]]:
        """Run `schedule` (one list per stage) to its end; returns the global order in which actions ran."""
        if len(schedule) != self.stages:
            raise ValueError(f"schedule has {len(schedule)} stages, expected {self.stages}")
        cursor = [0] * self.stages
        order: list[tuple[int, Action]] = []
        while any(cursor[s] < len(schedule[s]) for s in range(self.stages)):
            progressed = False
            for s in range(self.stages):
                while cursor[s] < len(schedule[s]):
                    action = schedule[s][cursor[s]]
                    message = peer_message(s, action)
                    if action.op in (Op.RECV_ACT, Op.RECV_GRAD):
                        if message not in self.in_flight:
                            break
                        self.in_flight.remove(message)
                    elif message is not None:
                        if message in self.in_flight:
                            raise ValueError(f"stage {s} sends {action} twice")
                        self.in_flight.add(message)
                    run(s, action)
                    order.append((s, action))
                    cursor[s] += 1
                    progressed = True
            if not progressed:
                waiting = ", ".join(f"stage {s} at {schedule[s][cursor[s]]}" for s in range(self.stages)
                                    if cursor[s] < len(schedule[s]))
                raise Deadlock(f"no stage can progress: {waiting}")
        return order


def validate(schedule: Schedule) -> None:
    """Raise if `schedule` deadlocks or leaves a message unreceived, or if a stage's backward of a microbatch comes
    before its forward, or a microbatch is run twice."""
    for s, actions in enumerate(schedule):
        forwards, backwards = set(), set()
        for a in actions:
            if a.op is Op.FORWARD:
                if a.mb in forwards:
                    raise ValueError(f"stage {s} runs the forward of {a.mb} twice")
                forwards.add(a.mb)
            elif a.op is Op.BACKWARD:
                if a.mb not in forwards or a.mb in backwards:
                    raise ValueError(f"stage {s} runs the backward of {a.mb} before its forward, or twice")
                backwards.add(a.mb)
    sim = Interleaver(len(schedule))
    sim.advance(schedule)
    if sim.in_flight:
        raise ValueError(f"messages never received: {sorted(sim.in_flight)}")
