"""Executors of a schedule: one worker per process with real P2P, or every worker in one process, same numerics."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from harness.comm.communicator import Communicator
from harness.comm.tags import pipeline_tag
from harness.schedule.ir import RECEIVES, SENDS, Action, Message, Op, Schedule, destination_stage, message_of
from harness.trace import TraceEvent
from methods.pipeline.core.codecs import Codec, Plain
from methods.pipeline.core.interleaver import Interleaver, stream_of
from methods.pipeline.core.overlap import ArrivalWatch
from methods.pipeline.core.placement import Placement
from methods.pipeline.core.stage import Key, Stage

CATEGORY = {"act": "activations", "grad": "activation_grads"}


class Sizes(dict):
    """Microbatch sizes by (iteration, mb): those of the step's own microbatches, and for any other (one cut in an
    earlier step, whose activation or gradient arrives now) the core's one rule: microbatch mb % M of a full
    minibatch cut into M consecutive slices (`split`)."""

    def __init__(self, given: Mapping[Key, int], split: Sequence[int]):
        super().__init__(given)
        self.split = list(split)

    def __missing__(self, key: Key) -> int:
        return self.split[key[1] % len(self.split)]


@dataclass
class Microbatches:
    """What one stage needs of the microbatches of a step, keyed by (iteration, mb): their sizes, the inputs (first
    stage), the labels and loss scales (last stage). A rank loads only the microbatches it owns."""

    sizes: Mapping[Key, int]
    inputs: dict[Key, torch.Tensor] = field(default_factory=dict)
    targets: dict[Key, torch.Tensor] = field(default_factory=dict)
    scales: dict[Key, float] = field(default_factory=dict)


@dataclass
class Wire:
    """How tensors cross stage boundaries: shapes[s] is the per-sample shape of the tensor entering stage s (the
    output of stage s-1; shapes[0] is the input's), and the codecs of activations and of their gradients."""

    shapes: Sequence[tuple[int, ...]]
    activation: Codec = field(default_factory=Plain)
    gradient: Codec = field(default_factory=Plain)

    def codec(self, kind: str) -> Codec:
        return self.activation if kind == "act" else self.gradient

    def shape(self, message: Message, size: int) -> tuple[int, ...]:
        """The tensor shape a message carries: an activation enters stage s+1, a gradient is w.r.t. stage s's input."""
        kind, stage, _, _ = message
        return (size, *self.shapes[stage + 1 if kind == "act" else stage])


@dataclass
class Trace:
    """Every action a worker ran, measured (harness/trace.py: op, microbatch, start, end, weight version, stage,
    iteration)."""

    events: list[TraceEvent] = field(default_factory=list)

    def add(self, action: Action, start: float, end: float, version: int = -1) -> None:
        self.events.append(TraceEvent(action.op.value, -1 if action.mb is None else action.mb, start, end, version,
                                      action.stage, action.iteration))


def run_compute(stage: Stage, action: Action, view: Microbatches, inbox: dict, outbox: dict) -> int:
    """Do a forward, backward or update on `stage`. Received tensors are in inbox[(kind, key)]; tensors to send are
    left in outbox[(kind, key)]. Returns the weight version a forward or backward used (-1 otherwise)."""
    key = action.key
    if action.op is Op.FORWARD:
        x = view.inputs[key] if stage.first else inbox.pop(("act", key))
        out = stage.forward(key, x, view.targets.get(key), view.scales.get(key, 1.0))
        if not stage.last:
            outbox[("act", key)] = out
        return stage.version_of(key)
    if action.op in (Op.BACKWARD, Op.BACKWARD_INPUT):  # the whole backward, or zero-bubble's B: both send dx back
        version = stage.backward_version_of(key)
        backward = stage.backward if action.op is Op.BACKWARD else stage.backward_input
        grad = backward(key, None if stage.last else inbox.pop(("grad", key)))
        if not stage.first:
            outbox[("grad", key)] = grad
        return version
    if action.op is Op.BACKWARD_WEIGHT:
        stage.backward_weight(key)
        return stage.policy.version
    if action.op is Op.UPDATE:
        stage.update()
        return -1
    raise ValueError(f"not a compute action: {action}")


def synced(flat_sum: torch.Tensor, mean: bool) -> torch.Tensor:
    """Replicas' summed [gradients..., backwards] -> the gradient to apply: the sum (a flushed pipeline, whose loss
    scales already weigh each microbatch), or the mean over the minibatches the replicas ran (PipeDream)."""
    grads, count = flat_sum[:-1], flat_sum[-1]
    return grads / count.clamp(min=1) if mean else grads


class ProcessExecutor:
    """Runs one rank's action list: sends are isend (waited for one step later, so a send never holds up the
    stage), receives are posted at the start of the step and waited for at their action, whose duration is therefore
    the wait. Tensors go through the wire's codecs; the communicator counts the payload bytes as `activations` and
    `activation_grads`. SYNC_GRADS all-reduces a stage's gradients among its replicas (`gradient_sync`).

    `overlap=False` turns the overlap off: a receive is posted at its action and a send completed there (or, when a
    receive follows it, together with that receive), so every transfer happens while the stage waits (apapo's
    comparison, and gpipe's and 1f1b's `exchange = "fused"`). Its sends block, so it is deadlock-free only for
    schedules whose blocking sends their peers' receives meet in order (one stage per rank: gpipe, 1f1b); an
    interleaved schedule hangs under it. `watch` (with overlap) is a communication thread that completes the
    pre-posted receives and notes their arrival (methods/pipeline/core/overlap.py)."""

    def __init__(self, rank: int, stages: Mapping[int, Stage], comm: Communicator, placement: Placement,
                 wire: Wire, replica_comms: Mapping[int, Communicator] | None = None, sync_mean: bool = False,
                 overlap: bool = True, watch: ArrivalWatch | None = None):
        self.rank, self.stages, self.comm, self.placement, self.wire = rank, dict(stages), comm, placement, wire
        self.replica_comms, self.sync_mean = dict(replica_comms or {}), sync_mean
        self.overlap, self.watch = overlap, watch
        self._boxes = {s: ({}, {}) for s in self.stages}  # per stage: (inbox, outbox)
        self._sends: list[dist.Work] = []
        self._older_sends: list[dist.Work] = []
        self._keep: list[torch.Tensor] = []  # send buffers stay alive until their send completes
        self._older_keep: list[torch.Tensor] = []

    def _post(self, a: Action, views: Mapping[int, Microbatches]) -> tuple[torch.Tensor, dist.Work]:
        message = message_of(a)
        kind, src_stage, _, mb = message
        size = views[a.stage].sizes[a.key]
        buf = torch.empty(self.wire.codec(kind).nbytes(math.prod(self.wire.shape(message, size))), dtype=torch.uint8)
        work = self.comm.irecv(buf, self.placement.owner(src_stage, mb), CATEGORY[kind],
                               pipeline_tag(kind, min(src_stage, destination_stage(message))))
        if self.overlap and self.watch is not None:
            self.watch.watch(stream_of(message, self.placement), message, work)
        return buf, work

    def run(self, actions: Sequence[Action], views: Mapping[int, Microbatches]) -> Trace:
        posted: dict[Message, tuple[torch.Tensor, dist.Work]] = {}
        if self.overlap:
            posted = {message_of(a): self._post(a, views) for a in actions if a.op in RECEIVES}
        exchange: tuple[dist.Work, torch.Tensor] | None = None  # without overlap: a send completed with a receive
        trace = Trace()
        clock = time.perf_counter
        for index, a in enumerate(actions):
            self.starting(a)
            start = clock()
            version = -1
            if a.op in RECEIVES:
                message = message_of(a)
                buf, work = posted.pop(message) if message in posted else self._post(a, views)
                if self.overlap and self.watch is not None:
                    self.watch.wait(message)
                else:
                    work.wait()
                if exchange is not None:
                    exchange[0].wait()
                    exchange = None
                kind = message[0]
                tensor = self.wire.codec(kind).decode(buf, self.wire.shape(message, views[a.stage].sizes[a.key]))
                self._boxes[a.stage][0][(kind, a.key)] = tensor
                del buf, work, tensor  # the inbox holds the message now: its compute frees it, not the step's end
            elif a.op in SENDS:
                message = message_of(a)
                kind, stage, _, mb = message
                payload = self.wire.codec(kind).encode(self._boxes[a.stage][1].pop((kind, a.key)),
                                                       stream_of(message, self.placement))
                dst = self.placement.owner(destination_stage(message), mb)
                tag = pipeline_tag(kind, min(stage, destination_stage(message)))
                work = self.comm.isend(payload, dst, CATEGORY[kind], tag)
                following = actions[index + 1] if index + 1 < len(actions) else None
                if self.overlap:
                    self._sends.append(work)
                    self._keep.append(payload)
                elif following is not None and following.op in RECEIVES:
                    # a send then a receive complete together (as Megatron-LM's send_forward_recv_backward): gloo's
                    # send waits for the peer's receive, and two blocking sends towards each other would deadlock
                    posted[message_of(following)] = self._post(following, views)
                    exchange = (work, payload)
                else:
                    work.wait()
            elif a.op is Op.SYNC_GRADS:
                self._sync(self.stages[a.stage])
            else:
                inbox, outbox = self._boxes[a.stage]
                version = run_compute(self.stages[a.stage], a, views.get(a.stage), inbox, outbox)
            trace.add(a, start, clock(), version)
        self._retire()
        return trace

    def starting(self, a: Action) -> None:
        """Before action `a` runs, outside its trace event (default: nothing; Q-FB's forward lane waits there for a
        stage's credit, methods/pipeline/qfb/lanes.py)."""

    def _sync(self, stage: Stage) -> None:
        flat = torch.cat([stage.flat_gradients(), torch.tensor([float(stage.backwards_since_update)])])
        self.replica_comms[stage.index].all_reduce(flat, "gradient_sync")
        stage.set_gradients(synced(flat, self.sync_mean))

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
    """Runs every rank's list in this process. The lists are interleaved as messages and collectives allow (see
    Interleaver); a message is the encoded payload, handed over in memory, and SYNC_GRADS sums the replicas' Stage
    objects' gradients in rank order. Each stage runs the same operations in the same order as under
    ProcessExecutor, so the numerics are the same (up to the summation order of a sync over 3+ replicas)."""

    def __init__(self, stages: Mapping[tuple[int, int], Stage], placement: Placement, wire: Wire,
                 sync_mean: bool = False):
        self.stages, self.placement, self.wire, self.sync_mean = dict(stages), placement, wire, sync_mean
        self.interleaver = Interleaver(placement)
        self._mail: dict[Message, torch.Tensor] = {}
        self._boxes = {worker: ({}, {}) for worker in self.stages}  # per (rank, stage): (inbox, outbox)

    def run(self, schedule: Schedule, views: Mapping[int, Microbatches]) -> list[Trace]:
        traces = [Trace() for _ in range(self.placement.world_size)]
        clock = time.perf_counter

        def execute(rank: int, a: Action) -> None:
            start = clock()
            inbox, outbox = self._boxes[(rank, a.stage)]
            version = -1
            if a.op in RECEIVES:
                message = message_of(a)
                kind = message[0]
                shape = self.wire.shape(message, views[a.stage].sizes[a.key])
                inbox[(kind, a.key)] = self.wire.codec(kind).decode(self._mail.pop(message), shape)
            elif a.op in SENDS:
                message = message_of(a)
                kind = message[0]
                payload = self.wire.codec(kind).encode(outbox.pop((kind, a.key)), stream_of(message, self.placement))
                self._mail[message] = payload.clone()
            elif a.op is Op.SYNC_GRADS:
                self._sync(rank, a)
            else:
                version = run_compute(self.stages[(rank, a.stage)], a, views[a.stage], inbox, outbox)
            traces[rank].add(a, start, clock(), version)

        self.interleaver.advance(schedule, execute)
        return traces

    def _sync(self, rank: int, action: Action) -> None:
        """The walk runs a sync on every replica once the last one reached it: the first replica sums every replica's
        gradients and gives each the result; the others pass."""
        group = self.placement.ranks_of(action.stage)
        if rank == group[0]:
            replicas = [self.stages[(r, action.stage)] for r in group]
            total = torch.stack([torch.cat([stage.flat_gradients(),
                                            torch.tensor([float(stage.backwards_since_update)])])
                                 for stage in replicas]).sum(dim=0)
            for stage in replicas:
                stage.set_gradients(synced(total, self.sync_mean))
