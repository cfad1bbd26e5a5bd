"""The pipeline simulator against closed forms: GPipe's and 1F1B's step time (M+S-1)(f+b) and bubble
(S-1)/(M+S-1), PipeDream's steady state, messages on shared links, syncs between replicas, and deadlocks."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.project.links import Link
from harness.project.pipemodel import FREE, StageCosts, pipeline_tasks
from harness.project.simulate import Task, period_s, simulate, simulated_bubble, step_ends
from harness.trace import ideal_bubble


def equal_stages(stages: int, forward: float, backward: float, nbytes: float = 0.0) -> list[StageCosts]:
    return [StageCosts(forward, backward, 0.0, 0.0, nbytes) for _ in range(stages)]


@settings(max_examples=40, deadline=None)
@given(stages=st.integers(1, 6), microbatches=st.integers(1, 9), method=st.sampled_from(["gpipe", "1f1b"]),
       forward=st.floats(0.1, 5.0), backward=st.floats(0.1, 5.0))
def test_flushed_pipelines_meet_the_closed_forms_on_a_free_link(stages, microbatches, method, forward, backward):
    ranks = pipeline_tasks(method, equal_stages(stages, forward, backward), microbatches, steps=1)
    spans = simulate(ranks, FREE)
    assert step_ends(spans)[0] == pytest.approx((microbatches + stages - 1) * (forward + backward))
    assert simulated_bubble(spans, 0) == pytest.approx(ideal_bubble(stages, microbatches))


@pytest.mark.parametrize("method", ["gpipe", "1f1b"])
def test_consecutive_flushed_steps_repeat_with_the_single_step_period(method):
    ranks = pipeline_tasks(method, equal_stages(3, 1.0, 2.0), 4, steps=5)
    assert period_s(simulate(ranks, FREE)) == pytest.approx((4 + 3 - 1) * 3.0)


def test_pipedream_steady_state_runs_at_the_slowest_stage():
    stages = [StageCosts(1.0, 2.0, 0.5, 0.0, 0.0), StageCosts(2.0, 1.0, 0.2, 0.0, 0.0),
              StageCosts(0.5, 0.5, 0.1, 0.0, 0.0)]
    spans = simulate(pipeline_tasks("pipedream", stages, 1, steps=12), FREE)
    assert period_s(spans) == pytest.approx(3.5)


def test_two_stage_gpipe_pays_each_message_once_on_the_critical_path():
    # M = 1: F0, message (alpha + n/B), F1, B1, message back, B0 -> 2f + 2b + 2 (alpha + n/B)
    link = Link("x", bandwidth=1000.0, alpha_s=0.05)
    ranks = pipeline_tasks("gpipe", equal_stages(2, 1.0, 2.0, nbytes=500.0), 1, steps=1)
    assert step_ends(simulate(ranks, link))[0] == pytest.approx(2 * 1.0 + 2 * 2.0 + 2 * (0.05 + 0.5))


def test_messages_queue_on_the_senders_link():
    # the receiver posts at 0, its ready notice reaches the sender at alpha = 0.1; two messages of 1 s each on the
    # link: 0.1..1.1 and 1.1..2.1, arriving alpha later
    link = Link("x", bandwidth=100.0, alpha_s=0.1)
    sender = [Task("send_act", 0, 0, 0.0, 100.0), Task("send_act", 0, 1, 0.0, 100.0)]
    receiver = [Task("recv_act", 1, 0), Task("recv_act", 1, 1), Task("forward", 1, 1, 0.5)]
    spans = simulate([sender, receiver], link)
    assert [round(s.end, 9) for s in spans[1]] == [1.2, 2.2, 2.7]


def test_a_message_moves_only_once_its_receive_is_posted():
    # the receiver is busy with step 0 until 3 s and posts step 1's receive then: the message sent at 0 moves
    # 3..4; the sender's step 2 waits for its step-0 send to complete (4 s)
    link = Link("x", bandwidth=100.0)
    sender = [Task("send_act", 0, 0, 0.0, 100.0, step=0), Task("forward", 0, 1, 1.0, step=1),
              Task("forward", 0, 2, 1.0, step=2)]
    receiver = [Task("forward", 1, 9, 3.0, step=0), Task("recv_act", 1, 0, step=1)]
    spans = simulate([sender, receiver], link)
    assert spans[1][1].end == pytest.approx(4.0)
    assert [s.start for s in spans[0]] == pytest.approx([0.0, 0.0, 4.0])


def test_a_burst_lets_a_message_through_as_far_as_its_tokens_last():
    # 50 bytes of tokens: a 100-byte message takes (100 - 50) / 100 = 0.5 s; a second one right after has none left
    link = Link("x", bandwidth=100.0, burst_bytes=50.0)
    sender = [Task("send_act", 0, 0, 0.0, 100.0), Task("send_act", 0, 1, 0.0, 100.0)]
    receiver = [Task("recv_act", 1, 0), Task("recv_act", 1, 1)]
    spans = simulate([sender, receiver], link)
    assert [s.end for s in spans[1]] == pytest.approx([0.5, 1.5])


def test_a_receive_of_a_message_sent_before_the_window_does_not_wait():
    spans = simulate([[Task("recv_grad", 0, 7), Task("backward", 0, 7, 1.0)]], FREE)
    assert spans[0][-1].end == pytest.approx(1.0)


def test_replicas_wait_for_each_other_at_a_sync_then_all_reduce():
    link = Link("x", bandwidth=100.0, alpha_s=0.0)
    fast = [Task("backward", 0, 0, 1.0), Task("sync_grads", 0, 0, nbytes=200.0), Task("update", 0, -1, 0.5)]
    slow = [Task("backward", 0, 1, 3.0), Task("sync_grads", 0, 0, nbytes=200.0), Task("update", 0, -1, 0.5)]
    spans = simulate([fast, slow], link)
    # both start the sync at 3 s; ring all-reduce of 200 B over 2 ranks: 2 s
    assert [s.end for s in spans[0]] == pytest.approx([1.0, 5.0, 5.5])
    assert [s.end for s in spans[1]] == pytest.approx([3.0, 5.0, 5.5])


def test_a_deadlock_is_an_error_naming_the_waiting_tasks():
    with pytest.raises(ValueError, match="deadlock.*recv_act"):
        simulate([[Task("recv_act", 1, 0), Task("send_grad", 1, 0)],
                  [Task("recv_grad", 0, 0), Task("send_act", 0, 0)]], FREE)


def test_infinite_links_cost_nothing():
    assert FREE.transfer_s(1e12) == 0.0
    assert math.isinf(FREE.bandwidth)
