"""A discrete-event simulator of per-rank action lists with durations: compute, sends and receives over shared
links, gradient syncs between replicas, and a rank's lanes (threads) at once. Pure: no processes, no clocks."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from harness.project.links import Link, TokenBucket, collective_s, shaped_seconds
from harness.schedule.ir import BACKWARDS, COMPUTE, RECEIVES, SENDS, Message, Op, message_key
from harness.schedule.walk import Handler, walk
from harness.trace import TraceEvent, step_bubble


@dataclass(frozen=True)
class Task:
    """One action of a rank. duration_s is the rank's own time on it (compute, or a send's local cost: encoding and
    launching); a receive takes no time of its own beyond waiting for its message. nbytes: the payload of a send or
    of a sync_grads (the stage's gradients). `step` says which simulated step (repetition) it belongs to. `lane`:
    which of the rank's lanes (threads) runs it; a rank's lanes run at the same time (Q-FB's forward and backward
    threads), each its own tasks in list order. `peers`: a sync_grads that stands for this many copies of the
    simulated ranks in lockstep (data-parallel copies of a pipeline): its all-reduce spans them all."""

    op: str
    stage: int
    mb: int
    duration_s: float = 0.0
    nbytes: float = 0.0
    iteration: int = 0
    step: int = 0
    lane: int = 0
    peers: int = 1

    @property
    def message(self) -> Message:
        """The message a send or receive handles, keyed as the executors key it (harness.schedule.ir.message_key:
        kind, sending stage, iteration, microbatch)."""
        key = message_key(self.op, self.stage, self.iteration, self.mb)
        if key is None:
            raise ValueError(f"{self.op} is not a send or a receive")
        return key


@dataclass(frozen=True)
class Span:
    """A task as simulated: when it started and ended on its rank."""

    task: Task
    start: float
    end: float


def simulate(ranks: Sequence[Sequence[Task]], link: Link) -> list[list[Span]]:
    """Run every rank's task list (ranks x tasks) and return the spans (ranks x tasks, in list order): the walk
    (harness/schedule/walk.py) of the ranks' lanes, timed by `Timing`.

    Each lane of a rank runs its tasks in list order, as the pipeline executor does (methods/pipeline/core/
    executor.py; a rank with one lane is one executor, Q-FB's two lanes are two, one per thread):
    - a compute or send task runs for its duration as soon as the lane's previous one ended;
    - a lane posts the receives of a step when it starts that step, and a message moves only once the sender got
      the receiver's ready notice (gloo sends an unbound buffer only then; measured: an isend completes when the
      receive is posted); the notice leaves behind what the receiver's own link is carrying then (one byte stream
      per pair) and takes alpha. The message starts at max(send end, notice, sender's egress free, receiver's
      ingress free), occupies both links for its bytes over B (less the tokens of a burst), and arrives alpha
      later; a receive ends at max(its start, the arrival); a receive whose
      message no task of the simulation sends (sent before the simulated window) does not wait;
    - before a lane starts step r+1 its sends of step r-1 must have completed (the executor waits for them at the
      end of step r), and every lane of its rank must have ended step r (the rank's step returns when all its
      lanes did);
    - a backward waits for the forward of the same microbatch on its rank (two lanes: LaneStage waits for it);
    - a sync_grads waits for every lane that has the same sync (stage, round, iteration, step), then all of them
      spend the ring all-reduce of its bytes over their count.
    Lanes share their rank's links. Lanes are advanced in the order of their clocks. Raises Deadlock (a ValueError)
    naming the waiting tasks.
    """
    timing = Timing(ranks, link)
    walk(timing.lanes, timing, lambda w: f"rank {timing.rank_of[w]}")
    return [[span for span in rank if span is not None] for rank in timing.spans]


class Timing(Handler[Task]):
    """The walk's time handler: per lane (a rank's tasks of one lane; `index`: their indices in the rank's list)
    clocks, positions and posted steps; messages in flight, links (per rank) and syncs. A lane is ready once its
    step has begun (`begin_step`) and its receive's message arrived, its sync is not waiting, its backward's forward
    ran; the ready lane with the earliest clock runs next."""

    def __init__(self, ranks: Sequence[Sequence[Task]], link: Link):
        self.link = link
        self.lanes: list[list[Task]] = []
        self.index: list[list[int]] = []
        self.rank_of: list[int] = []
        for r, tasks in enumerate(ranks):
            for lane in sorted({t.lane for t in tasks}):
                self.index.append([i for i, t in enumerate(tasks) if t.lane == lane])
                self.lanes.append([tasks[i] for i in self.index[-1]])
                self.rank_of.append(r)
        self.siblings = {r: [w for w in range(len(self.lanes)) if self.rank_of[w] == r] for r in range(len(ranks))}
        self.sent = {t.message for tasks in ranks for t in tasks if t.op in SENDS}
        self.receiver = {t.message: (w, t.step) for w, tasks in enumerate(self.lanes) for t in tasks
                         if t.op in RECEIVES}
        self.forwards = {(r, t.stage, t.iteration, t.mb) for r, tasks in enumerate(ranks) for t in tasks
                         if t.op == Op.FORWARD}
        self.syncs = Counter(sync_key(t) for tasks in ranks for t in tasks if t.op == Op.SYNC_GRADS)
        self.clock = [0.0] * len(self.lanes)
        self.position = [0] * len(self.lanes)
        self.spans: list[list[Span | None]] = [[None] * len(tasks) for tasks in ranks]
        self.arrival: dict[tuple, float] = {}
        self.done: dict[tuple, float] = {}  # message -> when its transfer ended (the send completes)
        self.forwarded: dict[tuple, float] = {}  # (rank, stage, iteration, mb) -> when its forward ended
        self.step_end: dict[tuple[int, int], float] = {}  # (lane, step) -> when the lane's last task of it ended
        self.posted: dict[tuple[int, int], float] = {}  # (lane, step) -> when its ready notices reach the senders
        self.pending: dict[tuple[int, int], list[tuple[tuple, int, float, float]]] = {}
        self.sends: dict[tuple[int, int], list[tuple]] = {}  # (lane, step) -> its messages
        self.egress = [TokenBucket(link) for _ in ranks]
        self.ingress = [TokenBucket(link) for _ in ranks]
        self.link_free = [[0.0, 0.0] for _ in ranks]  # per rank: egress, ingress free
        self.waiting: dict[tuple, dict[int, float]] = {}

    def starts_step(self, w: int) -> bool:
        p = self.position[w]
        return p == 0 or self.lanes[w][p - 1].step != self.lanes[w][p].step

    def step_over(self, w: int, step: int) -> bool:
        """Whether lane w has run every task of steps up to `step`."""
        p = self.position[w]
        return p >= len(self.lanes[w]) or self.lanes[w][p].step > step

    def begin_step(self, w: int, step: int) -> None:
        """A lane at the start of a step whose sends of two steps ago have completed, and whose rank's lanes have all
        ended the step before, begins it: its clock waits for them, and it posts the step's receives (which lets
        their messages move)."""
        retired = self.sends.get((w, step - 2), [])
        siblings = self.siblings[self.rank_of[w]]
        if (w, step) in self.posted or any(m not in self.done for m in retired) or \
                not all(self.step_over(v, step - 1) for v in siblings):
            return
        self.clock[w] = max([self.clock[w], *(self.done[m] for m in retired),
                             *(self.step_end.get((v, step - 1), 0.0) for v in siblings)])
        # the ready notices queue behind what the rank's link already carries (one byte stream per pair)
        self.posted[(w, step)] = max(self.clock[w], self.link_free[self.rank_of[w]][0]) + self.link.alpha_s
        for message, sender, ready, nbytes in self.pending.pop((w, step), []):
            self.transfer(message, sender, w, ready, nbytes)

    def ready(self, w: int, task: Task) -> bool:
        if self.starts_step(w):
            self.begin_step(w, task.step)
            if (w, task.step) not in self.posted:
                return False
        if task.op in RECEIVES:
            return task.message in self.arrival or task.message not in self.sent
        if task.op == Op.SYNC_GRADS:
            return w not in self.waiting.get(sync_key(task), {})
        if task.op in BACKWARDS:
            own = (self.rank_of[w], task.stage, task.iteration, task.mb)
            return own in self.forwarded or own not in self.forwards
        return True

    def pick(self, ready: Sequence[int], last: int) -> int:
        return min(ready, key=lambda w: self.clock[w])

    def finish(self, w: int, start: float, end: float) -> None:
        task = self.lanes[w][self.position[w]]
        self.spans[self.rank_of[w]][self.index[w][self.position[w]]] = Span(task, start, end)
        self.clock[w] = end
        self.step_end[(w, task.step)] = end
        self.position[w] += 1

    def run(self, w: int, task: Task) -> Sequence[int]:
        r = self.rank_of[w]
        if task.op == Op.SYNC_GRADS:
            return self.sync(w, task)
        start = self.clock[w]
        if task.op in BACKWARDS:
            start = max(start, self.forwarded.get((r, task.stage, task.iteration, task.mb), 0.0))
        end = max(start, self.arrival.get(task.message, 0.0)) if task.op in RECEIVES else start + task.duration_s
        if task.op == Op.FORWARD:
            self.forwarded[(r, task.stage, task.iteration, task.mb)] = end
        if task.op in SENDS and task.message in self.receiver:
            self.sends.setdefault((w, task.step), []).append(task.message)
            destination, step = self.receiver[task.message]
            if (destination, step) in self.posted:
                self.transfer(task.message, w, destination, end, task.nbytes)
            else:
                self.pending.setdefault((destination, step), []).append((task.message, w, end, task.nbytes))
        self.finish(w, start, end)
        return (w,)

    def transfer(self, message: tuple, sender: int, destination: int, ready: float, nbytes: float) -> None:
        """Move a message whose send (on lane `sender`) ended at `ready` and whose receive (on lane `destination`)
        is posted."""
        _, step = self.receiver[message]
        source, target = self.rank_of[sender], self.rank_of[destination]
        start = max(ready, self.posted[(destination, step)], self.link_free[source][0], self.link_free[target][1])
        end = start + shaped_seconds(nbytes, start, [self.egress[source], self.ingress[target]])
        self.link_free[source][0] = self.link_free[target][1] = end
        self.done[message] = end
        self.arrival[message] = end + self.link.alpha_s

    def sync(self, w: int, task: Task) -> Sequence[int]:
        """A lane reaches a sync: it waits until the last member arrives; then all of them are done together."""
        key = sync_key(task)
        self.waiting.setdefault(key, {})[w] = self.clock[w]
        if len(self.waiting[key]) < self.syncs[key]:
            return ()
        start = max(self.waiting[key].values())
        end = start + collective_s("all_reduce", task.nbytes, self.syncs[key] * task.peers, self.link)
        members = list(self.waiting.pop(key))
        for member in members:
            self.finish(member, start, end)
        return members


def sync_key(task: Task) -> tuple[int, int, int, int]:
    """Which sync a sync_grads task joins: (stage, round, iteration, step)."""
    return task.stage, task.mb, task.iteration, task.step


def step_ends(spans: Sequence[Sequence[Span]]) -> list[float]:
    """Per simulated step (0, 1, ...), the end of its last task on any rank."""
    ends: dict[int, float] = {}
    for rank in spans:
        for span in rank:
            ends[span.task.step] = max(ends.get(span.task.step, 0.0), span.end)
    return [ends[step] for step in sorted(ends)]


def period_s(spans: Sequence[Sequence[Span]]) -> float:
    """The steady-state time per step: (end of the last step - end of the step halfway) / the steps between.
    With one step, its end."""
    ends = step_ends(spans)
    if len(ends) == 1:
        return ends[0]
    half = (len(ends) - 1) // 2
    return (ends[-1] - ends[half]) / (len(ends) - 1 - half)


def busy_s(spans: Sequence[Sequence[Span]], step: int) -> float:
    """Mean over ranks of the time a rank spent in compute and send tasks of one step (the union over its lanes:
    two lanes busy at once count once)."""
    per_rank = []
    for rank in spans:
        intervals = sorted((s.start, s.end) for s in rank if s.task.step == step and (
            s.task.op in COMPUTE or s.task.op in SENDS))
        covered, reach = 0.0, -math.inf
        for start, end in intervals:
            covered += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        per_rank.append(covered)
    return sum(per_rank) / len(per_rank)


def simulated_bubble(spans: Sequence[Sequence[Span]], step: int) -> float:
    """harness.trace.step_bubble over one simulated step: 1 - mean busy / makespan of its compute tasks, the same
    arithmetic as the report's measured bubble."""
    traces = [[TraceEvent(s.task.op, s.task.mb, s.start, s.end, -1, s.task.stage, s.task.iteration)
               for s in rank if s.task.step == step] for rank in spans]
    return step_bubble([t for t in traces if any(e.op in COMPUTE for e in t)])
