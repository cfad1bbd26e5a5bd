"""The one walk over a schedule (harness/schedule/walk.py): each worker's list in order, a worker running while it can,
a collective done for all its members at once, a deadlock named; its order handler keeps messages in stream order,
and its bytes handler counts what each stage holds."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from harness.schedule.held import Held, in_flight_peaks
from harness.schedule.ir import Action, Op, message_of
from harness.schedule.walk import Deadlock, Handler, walk
from methods.pipeline.core.interleaver import Interleaver, stream_of
from methods.pipeline.core.placement import Placement
from methods.pipeline.flushed.schedules import gpipe, interleaved_1f1b, one_f_one_b


class Tokens(Handler[str]):
    """'+x' puts token x down, '-x' waits for it and takes it; '*x' is a barrier of every worker."""

    def __init__(self, workers: int):
        self.workers, self.tokens, self.barrier = workers, set(), []

    def ready(self, worker: int, action: str) -> bool:
        if action[0] == "-":
            return action[1:] in self.tokens
        return action[0] == "+" or worker not in self.barrier

    def run(self, worker: int, action: str) -> Sequence[int]:
        if action[0] == "*":
            self.barrier.append(worker)
            if len(self.barrier) < self.workers:
                return ()
            members, self.barrier = self.barrier, []
            return members
        (self.tokens.add if action[0] == "+" else self.tokens.remove)(action[1:])
        return (worker,)


def test_a_worker_runs_while_it_can_then_the_next_in_turn():
    order = walk([["-a", "+b", "+c"], ["+a", "-b", "-c"]], Tokens(2))
    assert order == [(1, "+a"), (0, "-a"), (0, "+b"), (0, "+c"), (1, "-b"), (1, "-c")]


def test_a_collective_is_done_for_all_its_members_when_the_last_arrives():
    order = walk([["*x", "+a"], ["+b", "*x"], ["-b", "*x", "-a"]], Tokens(3))
    assert order == [(1, "+b"), (2, "-b"), (0, "*x"), (1, "*x"), (2, "*x"), (0, "+a"), (2, "-a")]


def test_a_deadlock_names_every_waiting_worker():
    with pytest.raises(Deadlock, match=r"worker 0 at -a; worker 1 at -b"):
        walk([["-a", "+b"], ["-b", "+a"]], Tokens(2))
    with pytest.raises(Deadlock, match=r"rank 0 at \*x; rank 1 at \*x$"):  # rank 2 never reaches it
        walk([["*x"], ["*x"], ["+a"]], Tokens(3), "rank {}".format)


@pytest.mark.parametrize("schedule,placement", [
    (gpipe(3, 5), Placement.one_per_rank(3)),
    (one_f_one_b(4, 6), Placement.one_per_rank(4)),
    (interleaved_1f1b(2, 2, 4), Placement.interleaved(2, 2)),
])
def test_the_order_handler_receives_every_message_after_its_send_in_stream_order(schedule, placement):
    order = Interleaver(placement).advance(schedule)
    assert sorted(map(str, (a for _, a in order))) == sorted(map(str, (a for actions in schedule for a in actions)))
    sent: dict[tuple, list] = {}
    received: dict[tuple, list] = {}
    for _, a in order:
        if a.op in (Op.SEND_ACT, Op.SEND_GRAD, Op.RECV_ACT, Op.RECV_GRAD):
            message = message_of(a)
            book = sent if a.op in (Op.SEND_ACT, Op.SEND_GRAD) else received
            assert book is sent or message in sent.get(stream_of(message, placement), []), f"{a} before its send"
            book.setdefault(stream_of(message, placement), []).append(message)
    assert received == sent


def test_the_order_handler_refuses_a_receive_that_overtakes_its_stream():
    schedule = [[Action(Op.FORWARD, 0, 0), Action(Op.SEND_ACT, 0, 0), Action(Op.FORWARD, 0, 1),
                 Action(Op.SEND_ACT, 0, 1)],
                [Action(Op.RECV_ACT, 1, 1), Action(Op.FORWARD, 1, 1)]]
    with pytest.raises(ValueError, match="1rA1 would overtake"):
        Interleaver(Placement.one_per_rank(2)).advance(schedule)


def test_a_bytes_handler_counts_each_stage_s_activations_at_their_peak():
    """1F1B holds S - s microbatches at stage s, GPipe all M: here at 1000, 100 and 10 bytes a microbatch."""
    stage_bytes = [1000, 100, 10]
    for schedule, held in ((one_f_one_b(3, 6), [3, 2, 1]), (gpipe(3, 6), [6, 6, 6])):
        counter = Held(lambda action: stage_bytes[action.stage])
        walk(schedule, counter)
        assert counter.peaks == {(s, s): held[s] * stage_bytes[s] for s in range(3)}
        assert all(not live for live in counter.live.values())  # every microbatch released at its backward


def test_in_flight_peaks_takes_the_forward_lane_first():
    """A 1F1B step run as two lanes (Q-FB) may hold all of the step's microbatches: its forwards come first."""
    steps = [one_f_one_b(2, 4)]
    assert in_flight_peaks(steps) == {(0, 0): 2, (1, 1): 1}
    assert in_flight_peaks(steps, lanes=True) == {(0, 0): 4, (1, 1): 4}
