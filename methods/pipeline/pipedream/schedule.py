"""PipeDream's asynchronous 1F1B as ticks over the IR (core/actions.py): a forward, a delayed backward, an update."""

from __future__ import annotations

from harness.schedule.ir import Action, Op, Schedule, backward_unit, check_shape, forward_unit


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
