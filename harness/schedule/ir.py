"""The schedule IR every pipeline, the trace and the projection share: ops, actions, a schedule (each worker's ordered
action list), the units generators compose, the message a send or receive handles, and a rank's two lanes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Op(str, Enum):
    """What a stage does. Sends and receives name the microbatch whose tensor travels. A str: a trace's op names
    compare equal to these (`"forward" == Op.FORWARD`), so test membership with the tuples below, not with sets."""

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
#: Ops that occupy a stage's compute; receives are waits, sends hand-overs, a sync a collective between replicas.
COMPUTE = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.UPDATE)
RECEIVES = (Op.RECV_ACT, Op.RECV_GRAD)
SENDS = (Op.SEND_ACT, Op.SEND_GRAD)
#: The ops that differentiate a microbatch's forward (a zero-bubble B; its W follows B on the same rank).
BACKWARDS = (Op.BACKWARD, Op.BACKWARD_INPUT)
#: The ops a rank with two lanes (Q-FB) runs on its forward lane (thread); every other op is the backward lane's.
FORWARD_LANE_OPS = (Op.RECV_ACT, Op.FORWARD, Op.SEND_ACT)


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
#: A message between stages: (kind 'act' or 'grad', the sending stage, iteration, microbatch). The executors, the
#: order walk and the projection's simulator all key messages this way.
Message = tuple[str, int, int, int]


def message_key(op: str, stage: int, iteration: int, mb: int) -> Message | None:
    """The message a send or receive of `stage` handles (an activation received at s was sent by s-1, a gradient
    by s+1); None for other ops."""
    if op in SENDS:
        return ("act" if op == Op.SEND_ACT else "grad", stage, iteration, mb)
    if op in RECEIVES:
        return ("act", stage - 1, iteration, mb) if op == Op.RECV_ACT else ("grad", stage + 1, iteration, mb)
    return None


def message_of(action: Action) -> Message | None:
    """The message a send or receive action handles; None for other actions."""
    return message_key(action.op, action.stage, action.iteration, action.mb)  # type: ignore[arg-type]


def destination_stage(message: Message) -> int:
    kind, stage, _, _ = message
    return stage + 1 if kind == "act" else stage - 1


def split_lanes(actions: Sequence[Action]) -> tuple[list[Action], list[Action]]:
    """One rank's action list -> (its forward lane, its backward lane), each in the list's order."""
    lanes: tuple[list[Action], list[Action]] = ([], [])
    for a in actions:
        lanes[a.op not in FORWARD_LANE_OPS].append(a)
    return lanes


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
