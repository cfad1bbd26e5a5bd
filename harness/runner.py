"""The shared training loop: the same data order, budget, evaluation cadence and clocks for every method."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from harness.comm import Communicator
from harness.config import Budget, RunSpec
from harness.data import Batch, DataOrder, TensorData
from harness.method import EvalResult, Method
from harness.recorder import MetricsWriter, TrainClock

# Ranks agree on time-based decisions (time budget, eval_every_seconds) and on divergence with one tiny all-reduce
# (category `control`) about every CONTROL_PERIOD_S of train time. It is asynchronous: launched at step t with each
# rank's flags, its result is collected and acted on at step t + L by every rank, where L (1 to CONTROL_MAX_STEPS,
# from the measured step time) was itself agreed by the previous round. A rank ahead of the others (a pipeline's
# first stage) therefore never waits for them unless it is more than L steps ahead.
CONTROL_PERIOD_S = 0.5
CONTROL_MAX_STEPS = 64


@dataclass
class Plan:
    """The step-level schedule a budget implies for a data order."""

    max_steps: int | None
    eval_every_steps: int | None
    eval_every_seconds: float | None
    max_train_seconds: float | None

    @classmethod
    def from_budget(cls, budget: Budget, steps_per_epoch: int) -> Plan:
        limits = []
        if budget.max_steps is not None:
            limits.append(budget.max_steps)
        if budget.max_epochs is not None:
            limits.append(max(1, math.ceil(budget.max_epochs * steps_per_epoch - 1e-9)))
        every = None
        if budget.eval_every_epochs is not None:
            every = max(1, round(budget.eval_every_epochs * steps_per_epoch))
        return cls(min(limits) if limits else None, every, budget.eval_every_seconds, budget.max_train_seconds)


@dataclass
class Outcome:
    state: str  # completed or diverged
    steps: int
    epoch: float
    samples: int
    last_eval: dict[str, Any] | None
    message: str | None = None


class Loop:
    """Runs `method` under `spec`'s budget on one rank, writing train and eval records."""

    def __init__(self, spec: RunSpec, method: Method, train: TensorData, test: TensorData, comm: Communicator,
                 writer: MetricsWriter, clock: TrainClock):
        self.spec, self.method, self.train, self.test = spec, method, train, test
        self.comm, self.writer, self.clock = comm, writer, clock
        self.order = DataOrder(len(train), spec.params["batch_size"], spec.seed)
        self.plan = Plan.from_budget(spec.budget, self.order.steps_per_epoch)
        self.step = 0
        self.last_eval: dict[str, Any] | None = None
        self._next_eval_time = spec.budget.eval_every_seconds or math.inf
        self._diverged_at: int | None = None
        self._next_sync_step = 1
        self._interval = 1
        self._control = None  # (future, flags) of the control round in flight

    def run(self) -> Outcome:
        self.comm.barrier()  # every rank starts its train clock together, after its own set-up
        self.clock.start_training()
        self.evaluate()
        while self.plan.max_steps is None or self.step < self.plan.max_steps:
            diverged, time_up, eval_due = self.train_one_step()
            if diverged:
                self._settle()
                self.method.end_training()
                return Outcome("diverged", self.step, self.order.epoch_of(self.step), self._samples(),
                               self.last_eval, f"non-finite loss at step {self._diverged_at or self.step}")
            if time_up or (self.plan.max_steps is not None and self.step >= self.plan.max_steps):
                break  # the final evaluation comes after end_training, below
            if eval_due:
                self.evaluate()
        self._settle()
        self.method.end_training()
        self.evaluate()
        return Outcome("completed", self.step, self.order.epoch_of(self.step), self._samples(), self.last_eval)

    def train_one_step(self) -> tuple[bool, bool, bool]:
        """One global step: the batch, the method's step, its train record, and the ranks' agreement.

        Returns (diverged, time budget spent, evaluation due), the same on every rank.
        """
        batch = Batch(self.step, self.order.epoch_of(self.step), self.order.batch(self.step), self.train,
                      self.spec.seed)
        stats = self.method.train_step(batch)
        self.step += 1
        finite = stats.loss is None or math.isfinite(stats.loss)
        if self._diverged_at is None and not finite:
            self._diverged_at = self.step
        if self.step % self.spec.log_every_steps == 0 or not finite:
            self._log_train(stats.loss, stats.extra)
        last = self.plan.max_steps is not None and self.step >= self.plan.max_steps
        diverged, time_up, eval_by_time = self._agree(self._diverged_at is not None, last)
        eval_by_steps = bool(self.plan.eval_every_steps) and self.step % self.plan.eval_every_steps == 0
        return diverged, time_up, eval_by_steps or eval_by_time

    def _samples(self) -> int:
        return self.step * self.order.batch_size

    def _agree(self, diverged: bool, last: bool) -> tuple[bool, bool, bool]:
        """(diverged, time budget spent, eval due by time), the same on every rank."""
        train_s = self.clock.train()
        time_up = self.plan.max_train_seconds is not None and train_s >= self.plan.max_train_seconds
        eval_due = train_s >= self._next_eval_time
        if self.comm.world_size > 1:
            agreed = [False, False, False]
            if self._control is not None and (self.step >= self._next_sync_step or last):
                agreed = self._collect()
            if last:  # the final step: one blocking round on the current flags, so nothing is left unsaid
                self._launch(diverged, time_up, eval_due, train_s)
                final = self._collect()
                agreed = [a or b for a, b in zip(agreed, final, strict=True)]
            elif self._control is None:
                self._launch(diverged, time_up, eval_due, train_s)
            diverged, time_up, eval_due = agreed
        if eval_due:
            while self._next_eval_time <= train_s:
                self._next_eval_time += self.spec.budget.eval_every_seconds or math.inf
        return diverged, time_up, eval_due

    def _launch(self, diverged: bool, time_up: bool, eval_due: bool, train_s: float) -> None:
        proposal = min(CONTROL_MAX_STEPS, max(1, int(CONTROL_PERIOD_S * self.step / max(train_s, 1e-9))))
        flags = torch.tensor([float(diverged), float(time_up), float(eval_due), float(proposal)])
        future = self.comm.all_reduce(flags, "control", op=torch.distributed.ReduceOp.MAX, async_op=True)
        self._control = (future, flags)
        self._next_sync_step = self.step + self._interval

    def _settle(self) -> None:
        """Wait for a control round still in flight (every rank launched it at the same step)."""
        if self._control is not None:
            self._collect()

    def _collect(self) -> list[bool]:
        future, flags = self._control
        future.wait()
        self._control = None
        self._interval = int(flags[3])  # the same on every rank: the max of the proposals
        return [bool(v) for v in flags[:3].tolist()]

    def _log_train(self, loss: float, extra: dict[str, Any]) -> None:
        sent, recv = self.comm.ledger.training_bytes()
        self.writer.write("train", step=self.step, epoch=self.order.epoch_of(self.step), samples=self._samples(),
                          loss=loss, bytes_sent=sent, bytes_recv=recv,
                          bytes_by_category=self.comm.ledger.by_category(), **extra)

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
