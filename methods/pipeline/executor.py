"""Executors of a schedule: one stage per process with real P2P, or all stages in one process, same numerics."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from harness.comm.communicator import Communicator
from harness.comm.tags import Tag
from harness.trace import TraceEvent
from methods.pipeline.schedule import Action, Interleaver, Op, Schedule
from methods.pipeline.stage import Stage

CATEGORY = {"act": "activations", "grad": "activation_grads"}
TAG = {"act": Tag.ACTIVATIONS, "grad": Tag.ACTIVATION_GRADS}


@dataclass
class Microbatches:
    """What one stage needs of the microbatches of a step: their sizes, the inputs (first stage), the labels and loss
    scales (last stage). Keyed by the schedule's microbatch ids."""

    sizes: dict[int, int]
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    targets: dict[int, torch.Tensor] = field(default_factory=dict)
    scales: dict[int, float] = field(default_factory=dict)


@dataclass
class Trace:
    """Every action a stage ran, measured (harness/trace.py: op, microbatch, start, end, weight version)."""

    events: list[TraceEvent] = field(default_factory=list)

    def add(self, action: Action, start: float, end: float, version: int = -1) -> None:
        self.events.append(TraceEvent(action.op.value, -1 if action.mb is None else action.mb, start, end, version))


def run_action(stage: Stage, action: Action, micro: Microbatches, inbox: dict, outbox: dict) -> int:
    """Do the compute part of `action` on `stage`. Received tensors are in inbox[(kind, mb)]; tensors to send are left
    in outbox[(kind, mb)]. Returns the weight version a forward or backward used (-1 otherwise)."""
    op, mb = action.op, action.mb
    if op is Op.FORWARD:
        x = micro.inputs[mb] if stage.first else inbox.pop(("act", mb))
        out = stage.forward(mb, x, micro.targets.get(mb), micro.scales.get(mb, 1.0))
        version = stage.version_of(mb)
        if not stage.last:
            outbox[("act", mb)] = out
        return version
    if op is Op.BACKWARD:
        version = stage.version_of(mb)
        grad = stage.backward(mb, None if stage.last else inbox.pop(("grad", mb)))
        if not stage.first:
            outbox[("grad", mb)] = grad
        return version
    if op is Op.UPDATE:
        stage.update()
    return -1


def _peer(stage: int, op: Op) -> tuple[str, int]:
    return {Op.RECV_ACT: ("act", stage - 1), Op.SEND_ACT: ("act", stage + 1), Op.RECV_GRAD: ("grad", stage + 1),
            Op.SEND_GRAD: ("grad", stage - 1)}[op]


class ProcessExecutor:
    """Runs one stage's action list on this rank: sends are isend (waited for one step later, so a send never holds
    up the stage), receives are posted at the start of the step and waited for at their action, whose duration is
    therefore the wait. Bytes are counted by the communicator as `activations` and `activation_grads`.

    `ranks[s]` is the rank that runs stage s; `shapes[s]` is the per-sample shape of the tensor entering stage s
    (the output of stage s-1), for s = 1..S-1.
    """

    def __init__(self, stage: Stage, comm: Communicator, ranks: Sequence[int], shapes: Sequence[tuple[int, ...]],
                 dtype: torch.dtype = torch.float32):
        self.stage, self.comm, self.ranks, self.shapes, self.dtype = stage, comm, list(ranks), list(shapes), dtype
        self._sends: list[dist.Work] = []
        self._older_sends: list[dist.Work] = []
        self._keep: list[torch.Tensor] = []  # send buffers stay alive until their send completes
        self._older_keep: list[torch.Tensor] = []

    def _shape(self, kind: str, mb: int, micro: Microbatches) -> tuple[int, ...]:
        s = self.stage.index
        per_sample = self.shapes[s] if kind == "act" else self.shapes[s + 1]
        return (micro.sizes[mb], *per_sample)

    def run(self, actions: Sequence[Action], micro: Microbatches) -> Trace:
        s = self.stage.index
        posted: dict[tuple[str, int], tuple[torch.Tensor, dist.Work]] = {}
        for a in actions:
            if a.op in (Op.RECV_ACT, Op.RECV_GRAD):
                kind, peer = _peer(s, a.op)
                buf = torch.empty(self._shape(kind, a.mb, micro), dtype=self.dtype)
                posted[(kind, a.mb)] = (buf, self.comm.irecv(buf, self.ranks[peer], CATEGORY[kind], TAG[kind]))
        inbox: dict = {}
        outbox: dict = {}
        trace = Trace()
        clock = time.perf_counter
        for a in actions:
            start = clock()
            version = -1
            if a.op in (Op.RECV_ACT, Op.RECV_GRAD):
                kind, _ = _peer(s, a.op)
                buf, work = posted.pop((kind, a.mb))
                work.wait()
                inbox[(kind, a.mb)] = buf
            elif a.op in (Op.SEND_ACT, Op.SEND_GRAD):
                kind, peer = _peer(s, a.op)
                tensor = outbox.pop((kind, a.mb)).detach().contiguous()
                self._sends.append(self.comm.isend(tensor, self.ranks[peer], CATEGORY[kind], TAG[kind]))
                self._keep.append(tensor)
            else:
                version = run_action(self.stage, a, micro, inbox, outbox)
            trace.add(a, start, clock(), version)
        self._retire()
        return trace

    def _retire(self) -> None:
        """Wait for the sends of the previous step; this step's stay in flight until the next."""
        for work in self._older_sends:
            work.wait()
        self._older_sends, self._sends = self._sends, []
        self._older_keep, self._keep = self._keep, []

    def flush(self) -> None:
        """Wait for every send still in flight."""
        for work in self._older_sends + self._sends:
            work.wait()
        self._older_sends, self._sends = [], []
        self._older_keep, self._keep = [], []


class VirtualExecutor:
    """Runs every stage in this process. The stages' action lists are interleaved as messages allow (see
    Interleaver); a "message" is the tensor itself, handed over in memory. Each stage runs exactly the same
    operations in the same order as under ProcessExecutor, so the numerics are the same."""

    def __init__(self, stages: Sequence[Stage]):
        self.stages = list(stages)
        self.interleaver = Interleaver(len(self.stages))
        self._mail: dict[tuple[str, int, int], torch.Tensor] = {}  # (kind, dst stage, mb) -> tensor
        self._boxes = [({}, {}) for _ in self.stages]  # per stage: (inbox, outbox)

    def run(self, schedule: Schedule, micros: Sequence[Microbatches]) -> list[Trace]:
        traces = [Trace() for _ in self.stages]
        clock = time.perf_counter

        def execute(s: int, a: Action) -> None:
            start = clock()
            inbox, outbox = self._boxes[s]
            version = -1
            if a.op in (Op.RECV_ACT, Op.RECV_GRAD):
                kind, _ = _peer(s, a.op)
                inbox[(kind, a.mb)] = self._mail.pop((kind, s, a.mb))
            elif a.op in (Op.SEND_ACT, Op.SEND_GRAD):
                kind, peer = _peer(s, a.op)
                self._mail[(kind, peer, a.mb)] = outbox.pop((kind, a.mb)).detach().clone()
            else:
                version = run_action(self.stages[s], a, micros[s], inbox, outbox)
            traces[s].add(a, start, clock(), version)

        self.interleaver.advance(schedule, execute)
        return traces
