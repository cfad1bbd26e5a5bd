"""The schedule IR: actions, a schedule (each worker's ordered action list), the units generators compose, messages."""

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
    BACKWARD_INPUT = "backward_input"    # zero-bubble B: the gradient w.r.t. the stage input only
    BACKWARD_WEIGHT = "backward_weight"  # zero-bubble W: the weight gradient, from what B kept
    SEND_GRAD = "send_grad"     # gradient w.r.t. this stage's input, to stage s-1
    SYNC_GRADS = "sync_grads"   # all-reduce of the stage's weight gradients among its replicas (mb: the round)
    UPDATE = "update"           # optimizer step on the accumulated gradients (advances the weight version)


SHORT = {Op.RECV_ACT: "rA", Op.FORWARD: "F", Op.SEND_ACT: "sA", Op.RECV_GRAD: "rG", Op.BACKWARD: "B",
         Op.BACKWARD_INPUT: "I", Op.BACKWARD_WEIGHT: "W",
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


def check_shape(stages: int, microbatches: int) -> None:
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


def input_backward_unit(stage: int, stages: int, mb: int, iteration: int = 0) -> list[Action]:
    """backward_unit with the input-gradient half of the backward (zero-bubble B); its W runs apart."""
    return [Action(Op.BACKWARD_INPUT, a.stage, a.mb, a.iteration) if a.op is Op.BACKWARD else a
            for a in backward_unit(stage, stages, mb, iteration)]


def compute_order(schedule: Schedule) -> list[list[str]]:
    """Each worker's forwards, backwards and updates in order, as torch prints its IR ('0F0', '1B2', '0U')."""
    return [[str(a) for a in actions if a.op in COMPUTE] for actions in schedule]
