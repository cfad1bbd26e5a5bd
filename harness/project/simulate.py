"""A discrete-event simulator of per-rank action lists with durations: compute, sends and receives over shared
links, and gradient syncs between replicas. Pure: no processes, no clocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.project.links import Link, TokenBucket, ring_all_reduce_s, shaped_seconds
from harness.trace import COMPUTE_OPS, Message, TraceEvent, message_key, step_bubble

SENDS = {"send_act": "act", "send_grad": "grad"}
RECEIVES = {"recv_act": "act", "recv_grad": "grad"}


@dataclass(frozen=True)
class Task:
    """One action of a rank. duration_s is the rank's own time on it (compute, or a send's local cost: encoding and
    launching); a receive takes no time of its own beyond waiting for its message. nbytes: the payload of a send or
    of a sync_grads (the stage's gradients). `step` says which simulated step (repetition) it belongs to."""

    op: str
    stage: int
    mb: int
    duration_s: float = 0.0
    nbytes: float = 0.0
    iteration: int = 0
    step: int = 0

    @property
    def message(self) -> Message:
        """The message a send or receive handles, keyed as the executors key it (harness.trace.message_key: kind,
        sending stage, iteration, microbatch)."""
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
    """Run every rank's task list (ranks x tasks) and return the spans (ranks x tasks, in list order).

    Each rank runs its tasks in order, as the pipeline executor does (methods/pipeline/core/executor.py):
    - a compute or send task runs for its duration as soon as the previous one ended;
    - a rank posts the receives of a step when it starts that step, and a message moves only once the sender got
      the receiver's ready notice (gloo sends an unbound buffer only then; measured: an isend completes when the
      receive is posted); the notice leaves behind what the receiver's own link is carrying then (one byte stream
      per pair) and takes alpha. The message starts at max(send end, notice, sender's egress free, receiver's
      ingress free), occupies both links for its bytes over B (less the tokens of a burst), and arrives alpha
      later; a receive ends at max(its start, the arrival); a receive whose
      message no task of the simulation sends (sent before the simulated window) does not wait;
    - before a rank starts step r+1 its sends of step r-1 must have completed (the executor waits for them at the
      end of step r);
    - a sync_grads waits for every rank that has the same sync (stage, round, iteration, step), then all of them
      spend the ring all-reduce of its bytes over their count.
    Ranks are advanced in the order of their clocks. Raises ValueError on a deadlock, naming the waiting tasks.
    """
    sim = _Simulation(ranks, link)
    while True:
        sim.begin_steps()
        ready = [r for r in range(len(ranks)) if sim.position[r] < len(ranks[r]) and sim.can_run(r)]
        if not ready:
            stuck = [f"rank {r}: {ranks[r][sim.position[r]]}" for r in range(len(ranks))
                     if sim.position[r] < len(ranks[r])]
            if stuck:
                raise ValueError("deadlock: " + "; ".join(stuck))
            return sim.spans
        sim.run(min(ready, key=lambda rank: sim.clock[rank]))


class _Simulation:
    """The state of one simulation: clocks, positions, posted steps, messages in flight, links and syncs."""

    def __init__(self, ranks: Sequence[Sequence[Task]], link: Link):
        self.ranks, self.link = ranks, link
        self.sent = {t.message for tasks in ranks for t in tasks if t.op in SENDS}
        self.receiver = {t.message: (r, t.step) for r, tasks in enumerate(ranks) for t in tasks if t.op in RECEIVES}
        self.syncs: dict[tuple, int] = {}
        for tasks in ranks:
            for t in tasks:
                if t.op == "sync_grads":
                    self.syncs[sync_key(t)] = self.syncs.get(sync_key(t), 0) + 1
        self.clock = [0.0] * len(ranks)
        self.position = [0] * len(ranks)
        self.spans: list[list[Span]] = [[] for _ in ranks]
        self.arrival: dict[tuple, float] = {}
        self.done: dict[tuple, float] = {}  # message -> when its transfer ended (the send completes)
        self.posted: dict[tuple[int, int], float] = {}  # (rank, step) -> when its ready notices reach the senders
        self.pending: dict[tuple[int, int], list[tuple[tuple, int, float, float]]] = {}
        self.sends: dict[tuple[int, int], list[tuple]] = {}  # (rank, step) -> its messages
        self.egress = [TokenBucket(link) for _ in ranks]
        self.ingress = [TokenBucket(link) for _ in ranks]
        self.link_free = [[0.0, 0.0] for _ in ranks]  # per rank: egress, ingress free
        self.waiting: dict[tuple, dict[int, float]] = {}

    def starts_step(self, r: int) -> bool:
        p = self.position[r]
        return p == 0 or self.ranks[r][p - 1].step != self.ranks[r][p].step

    def begin_steps(self) -> None:
        """Every rank at the start of a step whose sends of two steps ago have completed begins it: its clock
        waits for them, and it posts the step's receives (which lets their messages move)."""
        for r in range(len(self.ranks)):
            if self.position[r] >= len(self.ranks[r]) or not self.starts_step(r):
                continue
            step = self.ranks[r][self.position[r]].step
            retired = self.sends.get((r, step - 2), [])
            if (r, step) in self.posted or any(m not in self.done for m in retired):
                continue
            self.clock[r] = max([self.clock[r], *(self.done[m] for m in retired)])
            # the ready notices queue behind what the rank's link already carries (one byte stream per pair)
            self.posted[(r, step)] = max(self.clock[r], self.link_free[r][0]) + self.link.alpha_s
            for message, sender, ready, nbytes in self.pending.pop((r, step), []):
                self.transfer(message, sender, r, ready, nbytes)

    def can_run(self, r: int) -> bool:
        task = self.ranks[r][self.position[r]]
        if self.starts_step(r) and (r, task.step) not in self.posted:
            return False
        if task.op in RECEIVES:
            return task.message in self.arrival or task.message not in self.sent
        if task.op == "sync_grads":
            return r not in self.waiting.get(sync_key(task), {})
        return True

    def run(self, r: int) -> None:
        task = self.ranks[r][self.position[r]]
        if task.op == "sync_grads":
            self.sync(r, task)
            return
        start = self.clock[r]
        end = max(start, self.arrival.get(task.message, 0.0)) if task.op in RECEIVES else start + task.duration_s
        if task.op in SENDS and task.message in self.receiver:
            self.sends.setdefault((r, task.step), []).append(task.message)
            destination, step = self.receiver[task.message]
            if (destination, step) in self.posted:
                self.transfer(task.message, r, destination, end, task.nbytes)
            else:
                self.pending.setdefault((destination, step), []).append((task.message, r, end, task.nbytes))
        self.spans[r].append(Span(task, start, end))
        self.clock[r] = end
        self.position[r] += 1

    def transfer(self, message: tuple, sender: int, destination: int, ready: float, nbytes: float) -> None:
        """Move a message whose send ended at `ready` and whose receive is posted."""
        _, step = self.receiver[message]
        start = max(ready, self.posted[(destination, step)], self.link_free[sender][0],
                    self.link_free[destination][1])
        end = start + shaped_seconds(nbytes, start, [self.egress[sender], self.ingress[destination]])
        self.link_free[sender][0] = self.link_free[destination][1] = end
        self.done[message] = end
        self.arrival[message] = end + self.link.alpha_s

    def sync(self, r: int, task: Task) -> None:
        key = sync_key(task)
        self.waiting.setdefault(key, {})[r] = self.clock[r]
        if len(self.waiting[key]) < self.syncs[key]:
            return  # until the last member arrives, can_run keeps the waiting ones out
        start = max(self.waiting[key].values())
        end = start + ring_all_reduce_s(task.nbytes, self.syncs[key], self.link)
        for member in self.waiting.pop(key):
            self.spans[member].append(Span(self.ranks[member][self.position[member]], start, end))
            self.clock[member] = end
            self.position[member] += 1


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
    """Mean over ranks of the time spent in compute and send tasks of one step."""
    per_rank = [sum(s.end - s.start for s in rank if s.task.step == step and (
        s.task.op in COMPUTE_OPS or s.task.op in SENDS)) for rank in spans]
    return sum(per_rank) / len(per_rank)


def simulated_bubble(spans: Sequence[Sequence[Span]], step: int) -> float:
    """harness.trace.step_bubble over one simulated step: 1 - mean busy / makespan of its compute tasks, the same
    arithmetic as the report's measured bubble."""
    traces = [[TraceEvent(s.task.op, s.task.mb, s.start, s.end, -1, s.task.stage, s.task.iteration)
               for s in rank if s.task.step == step] for rank in spans]
    return step_bubble([t for t in traces if any(e.op in COMPUTE_OPS for e in t)])
