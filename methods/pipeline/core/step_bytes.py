"""A pipeline rank's bytes through its steps, as a handler of the one walk: each stage's profiled terms (StageTerms)
added and released by the actions that allocate and free them, as the executor runs them, the peak with each
action's transients on top."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from harness.memory import MemoryBytes
from harness.schedule.ir import RECEIVES, SENDS, Action, Op, Schedule, split_lanes
from harness.schedule.walk import Handler, walk


@dataclass(frozen=True)
class StageTerms:
    """One stage replica's bytes, from its blocks' profiles on a full microbatch. Held throughout: `weights`
    (parameters and buffers), `optimizer` (its state) and `versions` (the weight versions its policy keeps, for
    the microbatches it holds). Per microbatch: `saved`, what autograd saves for its backward besides the stage's
    input and output storages (held from its forward to its backward, or to its W); `output`, the output tensor
    (not on the last stage: sent on, kept as the send's buffer until the executor retires it, one step later, and
    by the stage until its backward, whichever is later);
    `input`, the received activation the forward starts from (not on the first stage: its receive buffer, posted at
    the step's start, then the stage's saved input until the backward); `recv_act`/`recv_grad`, the payloads of
    the received activation and gradient (the wire codec's bytes); `send_act`/`send_grad`, a send's encoded
    payload where the codec copies (int8, fp16; a plain send is the tensor itself); `grad_input`, the input's
    gradient a backward sends back (kept as the send's buffer); `retained`, what a zero-bubble B keeps for its W
    besides `saved` (the gradients at the weights' graph nodes). Per step: `gradients` (one per parameter, from the
    step's first backward to its update) and `batch` (the first stage's inputs, the last stage's labels). Transients:
    `backward_temps` (a backward's own, beyond its gradients) and `update_temps` (the optimizer's step).
    Where a method profiles or keeps more per microbatch (0 or None: not used): `stash`, the weight version a
    forward keeps for its backward (held F..B as `versions`, instead of throughout); `kept_batch`, the first stage's
    input its forward saves, held until its backward past the step that loaded it (PB: a step's batch is one sample,
    its backward 2(S-1) steps later); `backward_peak`, the stage's whole backward profiled at once (the most bytes it
    holds above what existed before it: the gradients it makes, its transients, less the saved tensors autograd
    lets go as it goes; its input's gradient apart), for a step's first backward, instead of `gradients` +
    `backward_temps` on top of everything the microbatch saved; `codec_state`, what the wire's codecs keep from one
    message to the next (Q-FB's 2-Step GC: its error-feedback residuals), held throughout as buffers;
    `forward_temps`, a forward's transient before what it keeps (PB: the weights it predicts, with the prediction's
    own temporaries, and the forward's own peak)."""

    weights: int
    gradients: int
    optimizer: int
    saved: int
    output: int = 0
    input: int = 0
    recv_act: int = 0
    recv_grad: int = 0
    send_act: int = 0
    send_grad: int = 0
    grad_input: int = 0
    retained: int = 0
    batch: int = 0
    backward_temps: int = 0
    update_temps: int = 0
    versions: int = 0
    stash: int = 0
    kept_batch: int = 0
    backward_peak: int | None = None
    codec_state: int = 0
    forward_temps: int = 0


@dataclass
class _Live:
    """One worker's bytes now, by kind, and what its in-flight microbatches and messages hold."""

    gradients: int = 0
    activations: int = 0
    inputs: int = 0
    versions: int = 0
    owed: dict[tuple, int] = field(default_factory=dict)  # (stage, key) -> activation bytes its backward frees
    stashes: dict[tuple, int] = field(default_factory=dict)  # (stage, key) -> the weight version its forward kept
    carried: dict[tuple, tuple[int, int]] = field(default_factory=dict)  # (stage, key) -> (step, kept batch bytes)
    messages: dict[tuple, int] = field(default_factory=dict)  # (step, what, stage, key) -> buffer bytes
    graded: set[int] = field(default_factory=set)  # stages whose gradients exist (since their last update)
    unsent: dict[tuple, int] = field(default_factory=dict)  # (stage, key, 'out'/'dx') -> the step that made it

    @property
    def buffers(self) -> int:
        """The messages' bytes: derived, so that no message's bytes can stay counted after it is gone."""
        return sum(self.messages.values())

    def total(self) -> int:
        return self.gradients + self.activations + self.buffers + self.inputs + self.versions


class StepBytes(Handler[tuple[int, Action]]):
    """Walks each worker's actions of several steps ((step, action) pairs) with `terms[(worker, stage)]`: a step's
    receives are posted at its start (their payloads held until the backward that consumes them), a send's
    buffer is kept until the end of the next step (the executor's retire; where a codec copies, that is its encoded
    payload, and the gradient it encoded is freed at the send, the output kept by its stage until the backward), a
    forward holds its microbatch's activations until its backward (or W), the gradients exist from a stage's first
    backward to its update.
    `peaks[worker]` is the worker's bytes at its worst moment, by kind (temporaries: the transient of the action
    running then), besides what it holds throughout (weights, optimizer state, versions)."""

    def __init__(self, terms: Mapping[tuple[int, int], StageTerms], receives: Mapping[tuple[int, int], list[Action]]):
        self.terms, self.receives = terms, receives
        self.live: dict[int, _Live] = {}
        self.step: dict[int, int] = {}
        self.peaks: dict[int, MemoryBytes] = {}

    def _note(self, worker: int, live: _Live, transient: int = 0) -> None:
        now = MemoryBytes(gradients=live.gradients, activations=live.activations, buffers=live.buffers,
                          inputs=live.inputs, versions=live.versions, temporaries=transient)
        if worker not in self.peaks or now.total > self.peaks[worker].total:
            self.peaks[worker] = now

    def _begin(self, worker: int, step: int, live: _Live) -> None:
        """A new step: the sends of two steps back are retired, the step's receives posted, its batch loaded."""
        for key in [k for k in live.messages if k[0] <= step - 2 and k[1] == "send"]:
            if key[-1] == "out" and (key[2], key[3]) in live.owed:  # the stage keeps its output until the backward
                live.messages[(key[2], key[3], "kept")] = live.messages.pop(key)
            else:
                live.messages.pop(key)
        live.inputs = sum(t.batch for (w, _), t in self.terms.items() if w == worker) + sum(
            size for loaded, size in live.carried.values() if loaded < step)
        for a in self.receives.get((worker, step), []):
            t = self.terms.get((worker, a.stage))
            if t is None:
                continue
            size = t.recv_act if a.op is Op.RECV_ACT else t.recv_grad
            live.messages[(step, a.op, a.stage, a.key)] = size

    def run(self, worker: int, item: tuple[int, Action]) -> Sequence[int]:
        step, a = item
        live = self.live.setdefault(worker, _Live())
        if self.step.get(worker) != step:
            self.step[worker] = step
            self._begin(worker, step, live)
        t = self.terms.get((worker, a.stage))
        if t is None or a.op is Op.SYNC_GRADS:
            self._note(worker, live)
            return (worker,)
        transient = 0
        if a.op in RECEIVES:  # posted at the step's start: a plain payload is the tensor, a codec's is decoded
            k = (step, a.op, a.stage, a.key)
            if k in live.messages:
                decoded = t.input if a.op is Op.RECV_ACT else t.output
                live.messages[k] = decoded
        elif a.op in SENDS:
            # A message sent in a later step than the compute that made it (APapo's step opens with the previous
            # step's last SEND_GRAD) is retired a step after its send. Only that message moves: a flushed schedule's
            # keys recur every step, and last step's message of the same key was sent then.
            made = (a.stage, a.key, "dx" if a.op is Op.SEND_GRAD else "out")
            at = live.unsent.pop(made, step)
            if at < step and (at, "send", *made) in live.messages:
                live.messages[(step, "send", *made)] = live.messages.pop((at, "send", *made))
            extra = t.send_act if a.op is Op.SEND_ACT else t.send_grad
            if extra:
                live.messages[(step, "send", a.stage, a.key, a.op)] = extra
            if a.op is Op.SEND_GRAD:  # a codec's encoded copy left: the gradient it encoded is freed
                live.messages.pop((a.stage, a.key, "encoded dx"), None)
        elif a.op is Op.FORWARD:
            if t.forward_temps:
                self._note(worker, live, t.forward_temps)
            live.owed[(a.stage, a.key)] = t.saved
            live.activations += t.saved
            live.stashes[(a.stage, a.key)] = t.stash
            live.versions += t.stash
            if t.kept_batch:
                live.carried[(a.stage, a.key)] = (step, t.kept_batch)
            if t.output and t.send_act:  # a codec sends a copy: the stage keeps its output until the backward
                live.messages[(a.stage, a.key, "kept")] = t.output
            elif t.output:  # the output leaves as the send's buffer: kept until the executor retires it
                live.messages[(step, "send", a.stage, a.key, "out")] = t.output
                live.unsent[(a.stage, a.key, "out")] = step
        elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT):
            releases = a.op is not Op.BACKWARD_INPUT or t.input == 0  # the first stage's B is its whole backward
            if a.op is not Op.BACKWARD_WEIGHT and t.grad_input:  # until its send encodes it, or as the send's buffer
                dx = (a.stage, a.key, "encoded dx") if t.send_grad else (step, "send", a.stage, a.key, "dx")
                live.messages[dx] = t.grad_input
                if not t.send_grad:
                    live.unsent[(a.stage, a.key, "dx")] = step
            newly = releases and a.stage not in live.graded
            if newly:
                live.graded.add(a.stage)
                live.gradients += t.gradients
            transient, unmade = t.backward_temps, 0
            if t.backward_peak is not None and a.op is Op.BACKWARD and newly:  # profiled whole: before + its peak
                transient, unmade = max(0, t.backward_peak - t.gradients), max(0, t.gradients - t.backward_peak)
            live.gradients -= unmade  # the moment is exact in total; what the saved tensors let go made room for
            self._note(worker, live, transient)
            live.gradients += unmade
            if a.op is not Op.BACKWARD_WEIGHT:  # the received gradient lives through the backward it feeds
                for k in [k for k in live.messages if k[1] is Op.RECV_GRAD and k[2] == a.stage and k[3] == a.key]:
                    live.messages.pop(k)
            if releases:
                live.activations -= live.owed.pop((a.stage, a.key), 0)
                live.versions -= live.stashes.pop((a.stage, a.key), 0)
                loaded, size = live.carried.pop((a.stage, a.key), (step, 0))
                live.inputs -= size if loaded < step else 0
                live.messages.pop((a.stage, a.key, "kept"), None)
                for k in [k for k in live.messages if k[1] is Op.RECV_ACT and k[2] == a.stage and k[3] == a.key]:
                    live.messages.pop(k)
                if a.op is Op.BACKWARD_WEIGHT:
                    live.activations -= t.retained
            elif a.op is Op.BACKWARD_INPUT:
                live.activations += t.retained
        elif a.op is Op.UPDATE:
            transient = t.update_temps
            self._note(worker, live, transient)
            if a.stage in live.graded:
                live.graded.discard(a.stage)
                live.gradients -= t.gradients
        self._note(worker, live)
        return (worker,)


def rank_peaks(steps: Iterable[Schedule], terms: Mapping[tuple[int, int], StageTerms], lanes: bool = False
               ) -> dict[int, MemoryBytes]:
    """Each worker's plan over the steps' schedules run in order (each worker's actions in its list's order; with
    `lanes`, a step's forward lane taken first, as Q-FB may run it): what its stages hold throughout (weights,
    optimizer state, versions) plus the StepBytes walk's worst moment."""
    workers: dict[int, list[tuple[int, Action]]] = {}
    receives: dict[tuple[int, int], list[Action]] = {}
    for step, schedule in enumerate(steps):
        for worker, actions in enumerate(schedule):
            if lanes:
                actions = [a for lane in split_lanes(actions) for a in lane]
            workers.setdefault(worker, []).extend((step, a) for a in actions)
            receives[(worker, step)] = [a for a in actions if a.op in RECEIVES]
    for worker in {w for w, _ in terms}:
        workers.setdefault(worker, [])
    handler = StepBytes(terms, receives)
    order = sorted(workers)
    walk([workers[w] for w in order], _Renamed(handler, order))
    out: dict[int, MemoryBytes] = {}
    for (worker, _), t in sorted(terms.items()):
        held = MemoryBytes(weights=t.weights, optimizer=t.optimizer, versions=t.versions, buffers=t.codec_state)
        out[worker] = out.get(worker, MemoryBytes()) + held
    for worker in out:
        out[worker] = out[worker] + handler.peaks.get(worker, MemoryBytes())
    return out


class _Renamed(Handler[tuple[int, Action]]):
    """The walk's worker indices as the schedule's workers."""

    def __init__(self, inner: StepBytes, workers: list[int]):
        self.inner, self.workers = inner, workers

    def run(self, worker: int, item: tuple[int, Action]) -> Sequence[int]:
        self.inner.run(self.workers[worker], item)
        return (worker,)
