"""APapo's memory against what its run allocates (issue 52): the overlap thread lets go of a receive before it wakes the
compute thread, a rank keeps only its own stages' weights once built, a send's buffer is held until the end of the
step after its SEND (not after the compute that made it), and a stage of delay D > 0 prices its backward on a copy."""

from __future__ import annotations

import threading
import weakref

import torch
from torch import nn

from harness.memory import LossBlock, footprints, gradient_bytes
from harness.schedule.ir import Action, Op
from methods.pipeline.core.memory import backward_transients
from methods.pipeline.core.overlap import ArrivalWatch
from methods.pipeline.core.step_bytes import StageTerms, rank_peaks
from tests._dist import context, spawn


class _Work:
    """A receive's Work: it holds its buffer, as gloo's does, and completes when `done` is set."""

    def __init__(self, buffer: torch.Tensor):
        self.buffer, self.done = buffer, threading.Event()

    def wait(self) -> None:
        self.done.wait()


def test_the_overlap_thread_lets_go_of_a_receive_before_the_compute_thread_wakes():
    watch = ArrivalWatch()
    message = ("grad", 1, 0, 0)
    work = _Work(torch.zeros(16))
    gone = weakref.ref(work)
    watch.watch("stream", message, work)
    work.done.set()
    watch.wait(message)  # returns once the thread has set the message's event: after it let go of the Work
    del work
    try:
        assert gone() is None  # the compute thread held the last reference: its free is the meter's to see
    finally:
        watch.close()


def _own_weights_only(rank: int, world_size: int) -> tuple[int, int]:
    import gc

    cls, ctx = context("apapo", rank, world_size, {"microbatches": 4, "replicate": False,
                                                   "rank_speeds": [1.0, 1.0], "bandwidth": 1e9})
    made: list[weakref.ref] = []
    build = ctx.workload.make_model

    def recorded() -> nn.Module:
        model = build()
        made.extend(weakref.ref(p) for p in model.parameters())
        return model

    object.__setattr__(ctx.workload, "make_model", recorded)
    gc.disable()  # what the method leaves for Python's cycle collector must not be collected here by chance
    try:
        method = cls(ctx)
        alive = [r() for r in made if r() is not None]
        mine = {id(p) for stage in method.workers.values() for p in stage.module.parameters()}
        return len(alive), len([p for p in alive if id(p) in mine])
    finally:
        gc.enable()


def test_a_rank_keeps_only_the_weights_of_its_own_stage_once_apapo_is_built():
    for alive, mine in spawn(_own_weights_only, 2):
        assert alive == mine > 0  # the traced model and the other stage (torch.fx cycles) are gone already


def test_a_send_buffer_is_held_until_the_end_of_the_step_after_its_send():
    """APapo's last stage sends the gradient of a step's last backward as the next step's first action: it stays
    until the end of the step after that one (the executor retires a step's sends at the end of the next)."""
    def step(t: int) -> list[list[Action]]:
        sends = [Action(Op.SEND_GRAD, 1, t - 1)] if t else []
        return [sends + [Action(Op.RECV_ACT, 1, t), Action(Op.FORWARD, 1, t), Action(Op.BACKWARD, 1, t)]]

    terms = {(0, 1): StageTerms(weights=0, gradients=0, optimizer=0, saved=0, input=100, recv_act=100,
                                grad_input=100)}
    # at step 2's backward: dx 0 (sent in step 1), dx 1 (sent in step 2), dx 2 (made) and the received input
    assert rank_peaks([step(t) for t in range(4)], terms)[0].buffers == 400


def test_a_backward_on_a_copy_of_the_weights_keeps_the_copys_gradients_as_temporaries():
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 32), nn.ReLU()), nn.Linear(32, 4)]
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    loss = LossBlock(nn.functional.cross_entropy, y)
    prints = footprints([*blocks, loss], x, detach_inputs=True)
    live = backward_transients(blocks, x, loss, prints, accumulate=False)
    copied = backward_transients(blocks, x, loss, prints, accumulate=False, copies={0})
    assert copied[1:] == live[1:]
    assert copied[0] == live[0] + gradient_bytes([blocks[0]])
