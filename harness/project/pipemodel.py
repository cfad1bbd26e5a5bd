"""The pipeline cost model of one configuration: its traced step (actions, measured durations, message sizes) run
through the simulator on other links, or, for a method that gives its steady-state step (Method.step_schedule: every
built-in pipeline), that very schedule at other stage counts, batch and microbatch sizes with per-block costs;
calibrated on its measured runs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.project.dataparallel import StepParts
from harness.project.host import DEDICATED, Host, host_of, scaled, shared_run, sharing
from harness.project.links import Link
from harness.project.measured import RunMeasure
from harness.project.model import Projected
from harness.project.partition import stage_param_bytes, stage_ranges
from harness.project.profile import BlockCosts
from harness.project.simulate import Task, busy_s, period_s, simulate, simulated_bubble
from harness.schedule.ir import RECEIVES, SENDS, Op
from harness.split import uniform_split
from harness.trace import ScheduledAction, StepSchedule

#: Consecutive steps simulated to reach the steady state (the period is taken over the second half).
SIMULATED_STEPS = 8
FREE = Link("free", math.inf, 0.0)


@dataclass(frozen=True)
class StageCosts:
    """One stage's costs per microbatch: forward, backward and update seconds, a send's local seconds, and
    output_bytes, the activation it sends forward (its gradient comes back with the same size); weight_share: the
    part of the backward a zero-bubble schedule runs as W (the weight gradient), the rest as B."""

    forward_s: float
    backward_s: float
    update_s: float
    send_s: float
    output_bytes: float
    weight_share: float = 0.5


def step_schedule(method: str, stages: int, microbatches: int) -> StepSchedule | None:
    """The registered method's own steady-state step (None: it gives none the projection can re-shape)."""
    from harness.registry import METHODS, RegistryError

    try:
        cls = METHODS.get(method)
    except RegistryError:  # a method this installation does not have (a plug-in's, say): its traced shape only
        return None
    return cls.step_schedule(stages, microbatches)


def required_step_schedule(method: str, stages: int, microbatches: int) -> StepSchedule:
    """step_schedule, or ValueError naming the method when it gives none."""
    step = step_schedule(method, stages, microbatches)
    if step is None:
        raise ValueError(f"{method}: its method gives no schedule to re-shape (Method.step_schedule)")
    return step


def _op(action: ScheduledAction) -> str:
    """The action's op as a TraceEvent op string (a method's op may be a str enum)."""
    return getattr(action.op, "value", action.op)


def forwards_per_step(step: StepSchedule) -> int:
    """How many microbatches (or minibatches) the first stage runs forward per step: the batch over the
    microbatch size."""
    return max(1, sum(_op(a) == "forward" for a in step.ranks[0]))


def hybrid_shape(method: str, world_size: int, microbatches: int, blocks: int) -> tuple[int, int]:
    """(ranks per pipeline, data-parallel copies of it) for `world_size` ranks: the most ranks per pipeline, a
    divisor of world_size, whose schedule's stages fit `blocks`; ValueError when not even one rank's does."""
    for ranks in sorted((d for d in range(1, world_size + 1) if world_size % d == 0), reverse=True):
        if required_step_schedule(method, ranks, microbatches).stage_count <= blocks:
            return ranks, world_size // ranks
    raise ValueError(f"no pipeline of {method}'s schedule fits the model's {blocks} blocks")


def schedule_tasks(step: StepSchedule, stages: Sequence[StageCosts], steps: int) -> list[list[Task]]:
    """The step's actions as tasks with `stages`' costs (rank r runs stage r), repeated for `steps` steps. A send's
    bytes: an activation is its stage's output; a gradient sent back by stage s has the size of stage s-1's."""
    template = []
    for actions in step.ranks:
        tasks = []
        for a in actions:
            op, cost = _op(a), stages[a.stage]
            duration = {"forward": cost.forward_s, "backward": cost.backward_s, "update": cost.update_s,
                        "backward_input": cost.backward_s * (1 - cost.weight_share),
                        "backward_weight": cost.backward_s * cost.weight_share,
                        "send_act": cost.send_s, "send_grad": cost.send_s}.get(op, 0.0)
            nbytes = {"send_act": cost.output_bytes,
                      "send_grad": stages[a.stage - 1].output_bytes if a.stage else 0.0}.get(op, 0.0)
            tasks.append(Task(op, a.stage, -1 if a.mb is None else a.mb, duration, nbytes, a.iteration,
                              lane=step.lane(op)))
        template.append(tasks)
    return repeat(template, steps, step.shift, step.iteration_shift)


def pipeline_tasks(method: str, stages: Sequence[StageCosts], microbatches: int, steps: int,
                   ranks: int | None = None) -> list[list[Task]]:
    """Per rank (`ranks`, default one per stage), the tasks of `steps` consecutive steps of the method's own
    schedule on `stages` (one cost per model stage); ValueError when the method gives none, or names another number
    of stages."""
    step = required_step_schedule(method, ranks or len(stages), microbatches)
    if step.stage_count != len(stages):
        raise ValueError(f"{method}: its schedule on {ranks or len(stages)} ranks runs {step.stage_count} stages, "
                         f"not {len(stages)}")
    return schedule_tasks(step, stages, steps)


def repeat(template: Sequence[Sequence[Task]], steps: int, shift: int, iteration_shift: int = 0
           ) -> list[list[Task]]:
    """The traced step's tasks (ranks x tasks) for `steps` consecutive steps, microbatch ids (and sync rounds)
    shifted by `shift` per step and iteration ids (an update's too: the iteration it closes) by `iteration_shift`,
    so messages never mix steps; an update (mb -1) keeps its microbatch id."""
    return [[Task(t.op, t.stage, t.mb + r * shift if t.mb >= 0 else t.mb, t.duration_s, t.nbytes,
                  t.iteration + r * iteration_shift, r, t.lane, t.peers)
             for r in range(steps) for t in rank] for rank in template]


def run_on_link(ranks: list[list[Task]], link: Link, host: Host = DEDICATED, calibrated: float = 1.0
                ) -> tuple[float, float, float]:
    """(period, mean busy time per rank, bubble) of simulated steps on `link`. On a host whose cores the ranks
    share (a held-out run of a small machine), compute is slowed by the sharing the step implies (host.shared_run),
    from durations with the calibration's own sharing `calibrated` taken out."""
    base = scaled(ranks, 1 / calibrated) if calibrated != 1.0 else ranks
    window = set(range(SIMULATED_STEPS // 2, SIMULATED_STEPS))
    spans, _ = shared_run(base, host, lambda tasks: simulate(tasks, link), window)
    last = SIMULATED_STEPS - 1
    return period_s(spans), busy_s(spans, last), simulated_bubble(spans, last)


@dataclass
class PipelineModel:
    """One pipeline configuration, calibrated. traced: the traced step as tasks (ranks x tasks) with median
    durations and measured message bytes, for SIMULATED_STEPS steps (template_tasks); overhead_s: the measured step
    minus the simulated one (runner work between steps); for generated orders, per-block forward/backward scales
    (in-run / profiled, per calibration stage), update seconds per block, a send's local seconds and the wire's bytes
    per activation byte."""

    label: str
    method: str
    batch_size: int
    microbatches: int
    world_size: int
    ranges: list[tuple[int, int]]
    traced: list[list[Task]]
    overhead_s: float = 0.0
    profile: BlockCosts | None = None
    forward_scale: list[float] = field(default_factory=list)
    backward_scale: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    send_s: float = 0.0
    wire_ratio: float = 1.0
    generated_overhead_s: float = math.nan
    host_factor: float = 1.0
    weight_share: float = 0.5
    notes: list[str] = field(default_factory=list)
    #: What projections reuse, as a calibrated model is fixed: a shape's tasks (link-independent), and their period
    #: on a free link per host (the crossover scan projects one shape at hundreds of rates).
    shapes: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    free_periods: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def stage_costs(self, ranges: Sequence[tuple[int, int]], microbatch: float) -> tuple[list[StageCosts], bool]:
        """Per stage of `ranges`: the blocks' profiled costs at `microbatch` samples times their scales."""
        assert self.profile is not None
        forward, backward, extrapolated = self.profile.at(microbatch)
        stages = []
        for start, end in ranges:
            blocks = range(start, end)
            stages.append(StageCosts(
                sum(forward[b] * self.forward_scale[b] for b in blocks),
                sum(backward[b] * self.backward_scale[b] for b in blocks),
                sum(self.update_s[b] for b in blocks), self.send_s,
                self.profile.activation_bytes[end - 1] * microbatch * self.wire_ratio, self.weight_share))
        return stages, extrapolated

    def generated(self, world_size: int, batch: int, microbatches: int,
                  ranges: Sequence[tuple[int, int]] | None) -> tuple[list[list[Task]], list[str]]:
        """Tasks of the method's own schedule at this shape and notes; ValueError when none can be made. Given no
        partition, the pipeline is the deepest one (one stage per rank, several for an interleaved schedule) whose
        stages fit the model's blocks with its ranks dividing `world_size`; the other ranks hold copies of it, each
        on batch / copies samples, that all-reduce each stage's gradients before its update (hybrid_shape)."""
        if self.profile is None or not self.forward_scale:
            raise ValueError("no block costs to re-shape the pipeline")
        copies, notes = 1, []
        if ranges is None:
            ranks, copies = hybrid_shape(self.method, world_size, microbatches, self.profile.blocks)
            step = required_step_schedule(self.method, ranks, microbatches)
            ranges = uniform_split(self.profile.blocks, step.stage_count)
            if copies > 1:
                notes.append(f"{ranks} ranks per pipeline x {copies} data-parallel copies (the model has "
                             f"{self.profile.blocks} blocks)")
        else:
            step = required_step_schedule(self.method, world_size, microbatches)
            if step.stage_count != len(ranges):  # a replicated stage (pipedream replicas = [2, 1]): S < W
                raise ValueError(f"the run's partition has {len(ranges)} stages where the method's {world_size}-rank "
                                 f"schedule has {step.stage_count}: replicated stages are not re-shaped")
        count = forwards_per_step(step)
        if batch / copies / count < 1:
            raise ValueError(f"batch {batch} over {copies} copies x {count} microbatches is under one sample each")
        stages, extrapolated = self.stage_costs(ranges, batch / copies / count)
        if extrapolated:
            notes.append(f"microbatch {batch / copies / count:g} outside the profiled sizes: compute extrapolated")
        tasks = schedule_tasks(step, stages, SIMULATED_STEPS)
        if copies > 1:
            param_bytes = [sum(sum(self.profile.param_bytes[b]) for b in range(a, e)) for a, e in ranges]
            tasks = [[x for t in rank for x in ([Task("sync_grads", t.stage, -1, 0.0, param_bytes[t.stage],
                                                      t.iteration, t.step, t.lane, copies)] if t.op == "update"
                                                else []) + [t]] for rank in tasks]
        return tasks, notes

    def project(self, world_size: int, link: Link, batch: int | None = None, microbatches: int | None = None,
                ranges: list[tuple[int, int]] | None = None, host: Host = DEDICATED) -> Projected:
        """The traced step on `link` when the shape is the calibration's, else a generated order."""
        batch, microbatches = batch or self.batch_size, microbatches or self.microbatches
        key = (world_size, batch, microbatches, None if ranges is None else tuple(map(tuple, ranges)))
        if key not in self.shapes:
            self.shapes[key] = self.shaped(world_size, batch, microbatches, ranges)
        ranks, traced, more = self.shapes[key]
        if ranks is None:
            return Projected.missing(more[0])
        notes = list(self.notes)
        if traced:
            overhead = self.overhead_s
        else:
            overhead = self.generated_overhead_s
            notes += more + ["generated order: per-block costs at the new microbatch"]
        if (key, host, self.host_factor) not in self.free_periods:
            self.free_periods[key, host, self.host_factor] = run_on_link(ranks, FREE, host, self.host_factor)[0]
        free = self.free_periods[key, host, self.host_factor]
        period, busy, bubble = run_on_link(ranks, link, host, self.host_factor)
        step = period + overhead
        parts = StepParts(step_s=step, compute_s=busy, exposed_comm_s=period - free, bubble_s=free - busy,
                          other_s=overhead)
        return Projected(parts, bubble, notes)

    def shaped(self, world_size: int, batch: int, microbatches: int, ranges: list[tuple[int, int]] | None
               ) -> tuple[list[list[Task]] | None, bool, list[str]]:
        """(tasks, traced, notes) of a shape: the traced step when it is the calibration's, else a generated order
        and its notes; (None, False, [why]) when none can be made."""
        if (world_size, batch, microbatches) == (self.world_size, self.batch_size, self.microbatches) and (
                ranges is None or list(ranges) == list(self.ranges)):
            return self.traced, True, []
        try:
            ranks, more = self.generated(world_size, batch, microbatches, ranges)
        except ValueError as exc:
            return None, False, [str(exc)]
        return ranks, False, more


def template_tasks(measure: RunMeasure) -> list[list[Task]]:
    """The last traced step as tasks per worker, each on the lane that ran it (Q-FB's forward and backward threads;
    a lane's events in start order are its list), with each (worker, op, stage)'s duration over the traced steps
    (the measure's quantile, the median by default), repeated for SIMULATED_STEPS steps with the shifts of
    microbatch and iteration ids from one step to the next (step_shifts)."""
    durations = measure.durations()
    step = measure.traces[max(measure.traces)]
    param_bytes = stage_param_bytes(measure)
    ranks = []
    for worker in sorted(step):
        tasks = []
        for e in step[worker]:
            if e.op in SENDS:
                nbytes = measure.message_bytes.get(("act" if e.op == Op.SEND_ACT else "grad", e.stage), 0.0)
            else:
                nbytes = param_bytes.get(e.stage, 0.0) if e.op == Op.SYNC_GRADS else 0.0
            own = durations[(worker, e.op, e.stage)] if e.op not in (*RECEIVES, Op.SYNC_GRADS) else 0.0
            tasks.append(Task(e.op, e.stage, e.mb, own, nbytes, e.iteration, lane=e.lane))
        ranks.append(tasks)
    return repeat(ranks, SIMULATED_STEPS, *step_shifts(measure))


def step_shifts(measure: RunMeasure) -> tuple[int, int]:
    """(microbatch shift, iteration shift) from one step to the next: how the first forward of the first stage
    moves between the last two traced steps (apapo numbers microbatches globally and by iteration: (M, 1); Q-FB per
    window: (0, 1); PipeDream by minibatch: (1, 0)). Where the ids do not move (a flushed pipeline numbers each
    minibatch's microbatches from 0), or with one traced step, a stage's forwards per step and no iteration shift,
    so that the repeated steps' messages stay apart."""
    steps = sorted(measure.traces)
    firsts = {}
    for s in steps[-2:]:
        forwards = [e for events in measure.traces[s].values() for e in events if e.op == "forward" and e.stage == 0]
        if forwards:
            firsts[s] = min(forwards, key=lambda e: (e.iteration, e.mb))
    if len(firsts) == 2:
        (a, ea), (b, eb) = sorted(firsts.items())
        moved = (eb.mb - ea.mb, eb.iteration - ea.iteration)
        if moved != (0, 0) and moved[0] % (b - a) == 0 and moved[1] % (b - a) == 0:
            return moved[0] // (b - a), moved[1] // (b - a)
    forwards: dict[tuple[int, int], list[int]] = {}
    for events in measure.traces[steps[-1]].values():
        for e in events:
            if e.op == "forward":
                forwards.setdefault((e.stage, e.iteration), []).append(e.mb)
    return max((max(mbs) - min(mbs) + 1 for mbs in forwards.values()), default=1), 0


def calibrate_pipeline(measures: Sequence[RunMeasure], profile: BlockCosts | None, link: Link) -> PipelineModel:
    """From the seeds of one pipeline configuration at the calibration world size and network: the traced step of
    the first seed as the template, the overhead that makes the simulation meet the mean measured step, and (with a
    profile) the per-block scales for generated orders."""
    first = measures[0]
    repeated = template_tasks(first)
    ranges = stage_ranges(first)
    model = PipelineModel(first.label, str(first.spec.get("method")), first.batch_size, first.microbatches,
                          first.world_size, ranges, repeated, profile=profile)
    measured = statistics.fmean(m.step_s for m in measures)
    host = host_of(first.spec, first.run.manifest)
    if host.oversubscribed:  # its durations carry the sharing of its own host's cores
        model.host_factor = sharing(simulate(repeated, link), host, set(range(SIMULATED_STEPS // 2, SIMULATED_STEPS)))
    model.overhead_s = measured - run_on_link(repeated, link, host, model.host_factor)[0]
    if profile is None or not ranges or ranges[-1][1] != profile.blocks:
        model.notes.append("no block costs matching the partition: projections keep the traced shape")
        return model
    fit_blocks(model, first, profile)
    step = step_schedule(model.method, model.world_size, model.microbatches)
    if step is not None and len(set(model.ranges)) == len(model.ranges) == step.stage_count:
        ranks, _ = model.generated(model.world_size, model.batch_size, model.microbatches, model.ranges)
        model.generated_overhead_s = measured - run_on_link(ranks, link, host, model.host_factor)[0]
    return model


def stage_times(durations: dict[tuple[int, str, int], float], op: str, stage: int) -> list[float]:
    """Each worker's duration of `op` at `stage`; a backward split into B and W (zero bubble) counts as their
    sum."""
    times = [t for (w, o, st), t in durations.items() if o == op and st == stage]
    if op == "backward" and not times:
        times = [t + durations.get((w, "backward_weight", st), 0.0) for (w, o, st), t in durations.items()
                 if o == "backward_input" and st == stage]
    return times


def fit_blocks(model: PipelineModel, measure: RunMeasure, profile: BlockCosts) -> None:
    """Per-block scales (each calibration stage's median measured forward, backward per microbatch over its
    profiled sum at that microbatch), update seconds spread over a stage's blocks by parameter bytes, the median
    send's local seconds, and the measured bytes per message over the profiled activation bytes."""
    durations = measure.durations()
    count = model.microbatches  # from the run's params: 1 for a method without microbatches (pipedream)
    microbatch = model.batch_size / count
    forward, backward, _ = profile.at(microbatch)
    blocks = profile.blocks
    model.forward_scale, model.backward_scale, model.update_s = [1.0] * blocks, [1.0] * blocks, [0.0] * blocks
    for s, (start, end) in enumerate(model.ranges):
        span = range(start, end)
        for op, profiled, scales in (("forward", forward, model.forward_scale),
                                     ("backward", backward, model.backward_scale)):
            times = stage_times(durations, op, s)
            total = sum(profiled[b] for b in span)
            for b in span:
                scales[b] = statistics.median(times) / total if times and total > 0 else 1.0
        updates = stage_times(durations, "update", s)
        weights = [sum(profile.param_bytes[b]) for b in span]
        for b, weight in zip(span, weights, strict=True):
            model.update_s[b] = (statistics.median(updates) if updates else 0.0) * (
                weight / sum(weights) if sum(weights) else 1 / len(weights))
    shares = [w / (i + w) for (worker, o, st), i in durations.items() if o == "backward_input"
              for w in [durations.get((worker, "backward_weight", st), 0.0)] if w > 0]
    model.weight_share = statistics.median(shares) if shares else model.weight_share
    sends = [t for (w, o, st), t in durations.items() if o in SENDS]
    model.send_s = statistics.median(sends) if sends else 0.0
    wire = [measure.message_bytes[("act", s)] / (profile.activation_bytes[end - 1] * microbatch)
            for s, (_, end) in enumerate(model.ranges[:-1]) if ("act", s) in measure.message_bytes]
    model.wire_ratio = statistics.median(wire) if wire else 1.0
