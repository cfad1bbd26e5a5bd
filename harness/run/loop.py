"""The shared training loop: the same data order, budget, evaluation cadence and clocks for every method."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.budget import Budget
from harness.comm.communicator import Communicator
from harness.comm.states import gather_states
from harness.data.tensors import Batch, DataOrder, TensorData
from harness.memory.peak import AllocatorPeak
from harness.method import EvalResult, Method
from harness.run import checkpoint, checkpoint_files
from harness.run.clock import TrainClock
from harness.run.heartbeat import Heartbeat
from harness.run.lr_schedule import LrSchedule
from harness.run.records import MetricsWriter
from harness.run.usage import UsageSample, usage_record
from harness.suite.spec import RunSpec

# Ranks agree on time-based decisions (time budget, eval_every_seconds) and on divergence with one tiny all-reduce
# (category `control`) about every CONTROL_PERIOD_S of train time, and at least every CONTROL_MAX_STEPS steps. It is
# asynchronous: launched at step t with each rank's flags, its result is collected and acted on at step t + L by every
# rank, where L (1 to CONTROL_MAX_STEPS, from the measured step time) was itself agreed by the previous round. A rank
# ahead of the others (a pipeline's first stage) therefore never waits for them unless it is more than L steps ahead,
# and a non-finite loss on any rank stops every rank within 2L - 1 <= 15 steps of it, about 0.1 s of training (the
# round also carries the first such step, so the message names it whichever rank saw it). Measured side by side
# (issue 25): a round at least every 4 steps cost pb at batch 1 on 3 ranks a quarter to a half of its samples/s;
# every 0.05 s and 8 steps is within the noise of the former 0.5 s and 64 steps.
CONTROL_PERIOD_S = 0.05
CONTROL_MAX_STEPS = 8


@dataclass
class StepPlan:
    """The step-level schedule a budget implies for a data order."""

    max_steps: int | None
    eval_every_steps: int | None
    eval_every_seconds: float | None
    max_train_seconds: float | None

    @classmethod
    def from_budget(cls, budget: Budget, steps_per_epoch: int) -> StepPlan:
        limits = []
        if budget.max_steps is not None:
            limits.append(budget.max_steps)
        if budget.max_epochs is not None:
            limits.append(max(1, math.ceil(budget.max_epochs * steps_per_epoch - 1e-9)))
        every = budget.eval_every_steps
        if budget.eval_every_epochs is not None:
            every = max(1, round(budget.eval_every_epochs * steps_per_epoch))
        return cls(min(limits) if limits else None, every, budget.eval_every_seconds, budget.max_train_seconds)


@dataclass
class Outcome:
    state: str  # completed, diverged, or preempted (stopped by a signal, after a checkpoint where supported)
    steps: int
    epoch: float
    samples: int
    last_eval: dict[str, Any] | None
    message: str | None = None


class Loop:
    """Runs `method` under `spec`'s budget on one rank, writing train and eval records.

    Before every step the learning rate of each of the method's optimizers' param groups is set to its base lr (the
    lr the method built it with) times the schedule's factor for that step (harness/run/lr_schedule.py), so every
    method follows the same schedule and a resumed run the same lr. A constant schedule leaves the optimizers alone.
    At the end every rank writes a `cpu` record: its CPU time, run-queue wait and wall time over the run, and the
    machine's load (harness/run/usage.py), from which the report tells starved (noisy) runs.

    Checkpoints (run_dir/checkpoint.pt, the one before kept as checkpoint.prev.pt, each with a sha256 sidecar:
    harness/run/checkpoint_files.py) are written every spec.checkpoint_every_steps steps, at the end of the run
    when that is set, and when a stop is requested (checkpoint.STOP: a preemption or time-limit signal on any
    rank, agreed in the control round so that every rank stops after the same step). `restore` resumes from one.

    `heartbeat` (harness/run/heartbeat.py) is told where each training step begins and ends, for a hang watch;
    `allocator` (harness/memory/peak.py) too, to measure the allocator's peak over its window of steps.
    """

    def __init__(self, spec: RunSpec, method: Method, train: TensorData, test: TensorData, comm: Communicator,
                 writer: MetricsWriter, clock: TrainClock, run_dir: Path | None = None,
                 heartbeat: Heartbeat | None = None, allocator: AllocatorPeak | None = None):
        self.spec, self.method, self.train, self.test = spec, method, train, test
        self.heartbeat = heartbeat or Heartbeat()
        self.allocator = allocator
        self.comm, self.writer, self.clock = comm, writer, clock
        self.run_dir = run_dir
        self.spec_json = spec.model_dump_json()
        self.checkpointable = method.checkpointable and run_dir is not None
        self.checkpoint_every = spec.checkpoint_every_steps if self.checkpointable else None
        params = method.ctx.params  # the typed hyperparameters the method reads too (its Params, validated)
        self.order = DataOrder(len(train), params.batch_size, spec.seed)
        self.plan = StepPlan.from_budget(spec.budget, self.order.steps_per_epoch)
        self.schedule = LrSchedule.from_params(params, self.order.steps_per_epoch, self.plan.max_steps)
        self.optimizers = method.optimizers()
        if not self.schedule.is_constant and not self.optimizers:
            raise ValueError(f"method {spec.method!r} does not expose its optimizers (Method.optimizers), so the "
                             f"runner cannot apply lr_schedule {self.schedule.kind!r} or a warm-up to it")
        # taken before any restore: a checkpoint's optimizer state carries the lr of its last step, not the base
        self.base_lrs = [[group["lr"] for group in optimizer.param_groups] for optimizer in self.optimizers]
        self.base_lr = params.applied_lr  # the lr the optimizers were built with (derived for some methods)
        self.lr = self.base_lr  # it times the factor of the last step taken: the train records' lr
        self.step = 0
        self.last_eval: dict[str, Any] | None = None
        self._next_eval_time = spec.budget.eval_every_seconds or math.inf
        self._diverged_at: int | None = None  # this rank's first step with a non-finite loss
        self._first_nonfinite: int | None = None  # the first such step on any rank (agreed)
        self._next_sync_step = 1
        self._interval = 1
        # The control round's flags: one buffer for every round (a round is collected before the next launches),
        # written and read through its numpy view, which costs a step less than making and indexing a tensor.
        self._flags = torch.zeros(6, dtype=torch.float64)
        self._flag_values = self._flags.numpy()
        self._control = None  # the future of the control round in flight

    def run(self) -> Outcome:
        """Train to the end of the budget (or a divergence, or an agreed stop); then write this rank's `cpu` record."""
        self.comm.barrier()  # every rank starts its train clock together, after its own set-up
        self.clock.start_training()
        start = UsageSample.now()
        outcome = self._train()
        self.writer.write("cpu", **usage_record(start, UsageSample.now(), self.spec.threads_per_rank))
        return outcome

    def _train(self) -> Outcome:
        if self.step == 0:  # a resumed run evaluated its checkpoint's step before it was taken
            self.evaluate()
        while not self._last():
            diverged, time_up, eval_due, stop = self.train_one_step()  # stop: a signal number, or 0
            if diverged:
                self._settle()
                self.method.end_training()
                first = self._first_nonfinite or self.step
                return Outcome("diverged", self.step, self.order.epoch_of(self.step), self._samples(),
                               self.last_eval, f"non-finite loss at step {first} (stopped after step {self.step})")
            if time_up or self._last():
                break  # the final evaluation comes after end_training, below
            if eval_due:
                self.evaluate()
            if stop:
                self._settle()
                return self._stop(stop)
            if self.checkpoint_every and self.step % self.checkpoint_every == 0:
                self.checkpoint()
        self._settle()
        self.method.end_training()
        if self.last_eval is None or self.last_eval["step"] != self.step:
            self.evaluate()
        if self.checkpoint_every:
            self.checkpoint()  # the final state, for inspection and for comparing runs
        return Outcome("completed", self.step, self.order.epoch_of(self.step), self._samples(), self.last_eval)

    def _last(self) -> bool:
        return self.plan.max_steps is not None and self.step >= self.plan.max_steps

    def _stop(self, signum: int) -> Outcome:
        """A stop was agreed after this step: checkpoint (where the method supports it) and end as preempted."""
        name = checkpoint.signal_name(signum)
        if self.checkpointable:
            self.checkpoint()
            message = f"stopped by {name} after step {self.step}; {checkpoint.CHECKPOINT_FILE} holds that step"
        else:
            message = (f"stopped by {name} after step {self.step}; method {self.spec.method!r} does not support "
                       f"checkpoints, so a resumed run starts over")
        return Outcome("preempted", self.step, self.order.epoch_of(self.step), self._samples(), self.last_eval,
                       message)

    def train_one_step(self) -> tuple[bool, bool, bool, int]:
        """One global step: the batch, the method's step, its train record, and the ranks' agreement.

        Returns (diverged, time budget spent, evaluation due, stop), the same on every rank. `stop` is the number
        of a signal that asked some rank to stop (the largest, if several did), or 0.
        """
        self.heartbeat.begin_step()
        batch = Batch(self.step, self.order.epoch_of(self.step), self.order.batch(self.step), self.train,
                      self.spec.seed)
        if not self.schedule.is_constant:
            self.set_lr(self.step)
        if self.allocator is not None:  # around the method's own work only: the data order is the runner's
            self.allocator.begin_step()
        stats = self.method.train_step(batch)
        if self.allocator is not None:
            self.allocator.end_step()
        self.step += 1
        finite = stats.loss is None or math.isfinite(stats.loss)
        if self._diverged_at is None and not finite:
            self._diverged_at = self.step
        if self.step % self.spec.log_every_steps == 0 or not finite:
            self._log_train(stats.loss, stats.extra)
        diverged, time_up, eval_by_time, stop = self._agree(self._diverged_at is not None, self._last(),
                                                            checkpoint.STOP.signum)
        eval_by_steps = bool(self.plan.eval_every_steps) and self.step % self.plan.eval_every_steps == 0
        self.heartbeat.end_step()
        return diverged, time_up, eval_by_steps or eval_by_time, stop

    def set_lr(self, step: int) -> None:
        """Every param group's lr <- its base lr times the schedule's factor at `step` (0-based)."""
        factor = self.schedule.factor(step)
        for optimizer, bases in zip(self.optimizers, self.base_lrs, strict=True):
            for group, base in zip(optimizer.param_groups, bases, strict=True):
                group["lr"] = base * factor
        self.lr = self.base_lr * factor

    def _samples(self) -> int:
        return self.step * self.order.batch_size

    def _agree(self, diverged: bool, last: bool, stop: int) -> tuple[bool, bool, bool, int]:
        """(diverged, time budget spent, eval due by time, stop signal or 0), the same on every rank."""
        if (self.comm.world_size > 1 and not last and self._control is not None
                and self.step < self._next_sync_step):
            return False, False, False, 0  # a round is in flight and not yet due: nothing is agreed at this step
        train_s = self.clock.train()
        time_up = self.plan.max_train_seconds is not None and train_s >= self.plan.max_train_seconds
        eval_due = train_s >= self._next_eval_time
        if self.comm.world_size == 1:
            self._first_nonfinite = self._diverged_at
        else:
            agreed = [False, False, False, 0, -math.inf]
            if self._control is not None and (self.step >= self._next_sync_step or last):
                agreed = self._collect()
            if last:  # the final step: one blocking round on the current flags, so nothing is left unsaid
                self._launch(diverged, time_up, eval_due, stop, train_s)
                final = self._collect()
                agreed = [max(a, b) for a, b in zip(agreed, final, strict=True)]
            elif self._control is None:
                self._launch(diverged, time_up, eval_due, stop, train_s)
            diverged, time_up, eval_due, stop = bool(agreed[0]), bool(agreed[1]), bool(agreed[2]), int(agreed[3])
            if diverged and math.isfinite(agreed[4]):
                self._first_nonfinite = int(-agreed[4])
        if eval_due:
            while self._next_eval_time <= train_s:
                self._next_eval_time += self.spec.budget.eval_every_seconds or math.inf
        return diverged, time_up, eval_due, stop

    def _launch(self, diverged: bool, time_up: bool, eval_due: bool, stop: int, train_s: float) -> None:
        proposal = min(CONTROL_MAX_STEPS, max(1, int(CONTROL_PERIOD_S * self.step / max(train_s, 1e-9))))
        first = -float(self._diverged_at) if self._diverged_at is not None else -math.inf  # MAX: the earliest
        self._flag_values[:] = (float(diverged), float(time_up), float(eval_due), float(stop), float(proposal), first)
        self._control = self.comm.all_reduce(self._flags, "control", op=torch.distributed.ReduceOp.MAX,
                                             async_op=True)
        self._next_sync_step = self.step + self._interval

    def _settle(self) -> None:
        """Wait for a control round still in flight (every rank launched it at the same step)."""
        if self._control is not None:
            self._collect()

    def _collect(self) -> list[float]:
        """The agreed flags: (diverged, time_up, eval_due, stop signal, minus the first non-finite step), each the
        max over ranks."""
        self._control.wait()
        self._control = None
        agreed = self._flag_values.tolist()
        self._interval = int(agreed[4])  # the same on every rank: the max of the proposals
        return [*agreed[:4], agreed[5]]

    def _log_train(self, loss: float, extra: dict[str, Any]) -> None:
        sent, recv = self.comm.ledger.training_bytes()
        self.writer.write_train(self.step, self.order.epoch_of(self.step), self._samples(), loss, self.lr, sent, recv,
                                self.comm.ledger.by_category(), extra)

    def evaluate(self) -> EvalResult | None:
        """Evaluate with the train clock stopped on every rank (a barrier closes the excluded interval)."""
        with self.clock.excluded():
            result = self.method.evaluate(self.test)
            self.comm.barrier()
        if self.comm.rank == 0:
            if result is None:
                raise RuntimeError(f"method {self.spec.method!r} returned no evaluation result on rank 0")
            record = {"step": self.step, "epoch": self.order.epoch_of(self.step), "samples": self._samples(),
                      "test_accuracy": result.accuracy, "test_loss": result.loss, **result.extra}
            self.writer.write("eval", **record)
            self.last_eval = record
        else:
            self.last_eval = {"step": self.step}
        return result

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Every rank's state gathered to rank 0, which writes run_dir/checkpoint.pt (the old one becoming
        checkpoint.prev.pt) with its sidecar, keeping a valid checkpoint on disk throughout. Collective.

        Off the train clock. The traffic goes around the Communicator: it is not part of the method's bytes. The
        size of metrics.jsonl is taken between two barriers, when every rank has written every record up to this
        step and none has written more; a resumed run cuts the file back to it.
        """
        with self.clock.excluded():
            world = self.comm.world_size
            mine = {"method": self.method.state_dict(), "rng": checkpoint.rng_state(),
                    "ledger": self.comm.ledger.state_dict()}
            if world > 1:
                dist.barrier(group=self.comm.group)
            metrics_bytes = os.path.getsize(self.writer.path) if self.comm.rank == 0 else 0
            if world > 1:
                dist.barrier(group=self.comm.group)
                states = gather_states(mine, dst=0, group=self.comm.group)  # no pickle: harness/comm/states.py
            else:
                states = [mine]
            if self.comm.rank == 0:
                checkpoint_files.write(self.run_dir, {
                    "format": checkpoint.FORMAT_VERSION, "run_id": self.spec.run_id,
                    "spec": self.spec_json, "world_size": world, "step": self.step,
                    "epoch": self.order.epoch_of(self.step), "samples": self._samples(),
                    "train_time_s": self.clock.train(), "wall_time_s": self.clock.wall(),
                    "metrics_bytes": metrics_bytes,
                    "loop": {"next_eval_time": self._next_eval_time, "interval": self._interval,
                             "last_eval": self.last_eval},
                    "ranks": states}, checkpoint_files.spec_hash(self.spec_json))
            if world > 1:
                dist.barrier(group=self.comm.group)  # the file is complete before any rank goes on or exits

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from a checkpoint: the step, cadences, this rank's method state, bytes and RNG streams.

        The train clock's offset is the caller's (TrainClock(offset_train_s=...)); it is made before the loop.
        """
        mine = saved["ranks"][self.comm.rank]
        self.step = int(saved["step"])
        loop = saved["loop"]
        self._next_eval_time = float(loop["next_eval_time"])
        self._interval = int(loop["interval"])
        self._next_sync_step = self.step + 1
        last_eval = loop["last_eval"]
        self.last_eval = last_eval if self.comm.rank == 0 or last_eval is None else {"step": last_eval["step"]}
        self.method.load_state_dict(mine["method"])
        self.comm.ledger.load_state_dict(mine["ledger"])
        checkpoint.set_rng_state(mine["rng"])  # last: nothing above may draw from the restored streams
