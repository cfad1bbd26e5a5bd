"""Q-FB's windows over the IR (core/actions.py): forward and backward lanes per stage; the prototype's run-ahead."""

from __future__ import annotations

from typing import Literal

from harness.schedule.ir import Action, Op, backward_unit, forward_unit

Sync = Literal["exact", "bounded", "ahead"]


def qfb_tick(stage: int, stages: int, microbatches: int, window: int, sync: Sync) -> list[Action]:
    """Stage `stage`'s actions in runner step `window`.

    exact: the forwards and the backwards of window t, merged as 1F1B merges them (S-1-s forwards first; the order
        one lane would run them in), then the update. The lanes split the list by op (methods/pipeline/qfb/lanes.py).
    bounded: the forwards of window t and the backwards of window t-1 (none at t = 0), one of each in turn, then the
        update of window t-1; `qfb_drain` runs the backwards and update of the last window.
    Microbatch m of window t is Action(..., mb=m, iteration=t); the update of window w is Action(UPDATE, s, None, w)."""
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
    return actions + ([Action(Op.UPDATE, stage, None, backward_window)] if backwards else [])


def qfb_drain(stage: int, stages: int, microbatches: int, last_window: int) -> list[Action]:
    """bounded: the backwards and update of the last window, after the last step."""
    return [a for m in range(microbatches) for a in backward_unit(stage, stages, m, last_window)] + [
        Action(Op.UPDATE, stage, None, last_window)]


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
