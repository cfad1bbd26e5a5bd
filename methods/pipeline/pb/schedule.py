"""Pipelined Backpropagation's per-sample ticks over the IR (core/actions.py): a forward, a backward, an update."""

from __future__ import annotations

from harness.schedule.ir import Action, Op, backward_unit, check_shape, forward_unit


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
