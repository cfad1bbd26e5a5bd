"""Learning-rate schedules: the factor of each step by hand and against torch's schedulers, the runner applying it
the same way to every method (real processes), a constant schedule leaving runs unchanged, and bad suites."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness import registry
from harness.budget import Budget
from harness.data.tensors import Batch, DataOrder
from harness.launch.local import launch
from harness.launch.suite import prepare_run_dir
from harness.method import EvalResult, Method, StepStats, TrainParams
from harness.optim import make_optimizer
from harness.results import read_jsonl
from harness.run import checkpoint
from harness.run.loop import Loop
from harness.run.lr_schedule import LrSchedule, schedule_problem
from harness.suite.expand import expand_suite
from harness.suite.files import FileError
from harness.workloads.builtin import DIGITS_MLP

STEPS = 60  # digits-mlp at batch 32: 44 steps per epoch
#: digits-mlp with a budget of time alone (a workload referenced by path from a suite)
TIMED_DIGITS = dataclasses.replace(DIGITS_MLP, name="timed-digits", budget=Budget(max_train_seconds=5))


def schedule(kind: str, total: int = 100, warmup_steps: int = 0, **params) -> LrSchedule:
    train = TrainParams(lr_schedule=kind, lr_warmup_epochs=warmup_steps / 10, **params)
    return LrSchedule.from_params(train, 10, total)


def test_factors_by_hand():
    step = schedule("step", 100, milestones=[0.5, 0.75], gamma=0.1)
    assert [step.factor(t) for t in (0, 49, 50, 74, 75, 99)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    warm = schedule("constant", 100, warmup_steps=10, lr_warmup_start_factor=0.1)
    assert [warm.factor(t) for t in (0, 5, 9, 10, 50)] == pytest.approx([0.1, 0.55, 0.91, 1, 1])
    cosine = schedule("cosine", 110, warmup_steps=10, lr_warmup_start_factor=0.5)
    assert [cosine.factor(t) for t in (0, 10, 60, 110)] == pytest.approx([0.5, 1.0, 0.5, 0.0], abs=1e-12)
    assert schedule("constant").is_constant and not warm.is_constant and not step.is_constant


def torch_factors(optimizer: torch.optim.Optimizer, scheduler, steps: int) -> list[float]:
    factors = []
    for _ in range(steps):
        factors.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return factors


def test_step_schedule_with_warmup_matches_torch_linear_and_multistep():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = torch.optim.lr_scheduler.ChainedScheduler([
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=20),
        torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[100, 150], gamma=0.2)])
    ours = schedule("step", 200, warmup_steps=20, lr_warmup_start_factor=0.25, gamma=0.2)
    assert [ours.factor(t) for t in range(200)] == pytest.approx(torch_factors(optimizer, sched, 200), rel=1e-12)


def test_cosine_schedule_with_warmup_matches_torch_linear_then_cosine():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = torch.optim.lr_scheduler.SequentialLR(optimizer, [
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=30),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=170)], milestones=[30])
    ours = schedule("cosine", 200, warmup_steps=30, lr_warmup_start_factor=0.1)
    assert [ours.factor(t) for t in range(200)] == pytest.approx(torch_factors(optimizer, sched, 200), abs=1e-9)


def test_a_step_schedule_needs_a_planned_step_count(tmp_path):
    assert schedule_problem(TrainParams(lr_schedule="cosine"), None, None)[0] == "lr_schedule"
    assert schedule_problem(TrainParams(lr_schedule="cosine"), None, 1.0) is None
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\n[budget]\nmax_train_seconds = 5\nmax_epochs = 1\n'
                     '[defaults]\nlr_schedule = "step"\n[[run]]\nmethod = "sgd"\n')
    expand_suite(suite)  # max_epochs from the suite: fine
    suite.write_text('name = "s"\nworkload = "test_lr_schedule:TIMED_DIGITS"\n'
                     '[[run]]\nmethod = "sgd"\nparams = { lr_schedule = "step" }\n')
    with pytest.raises(FileError, match=r"s.toml: run\[0\].params.lr_schedule: 'step' needs a planned number"):
        expand_suite(suite)


def test_bad_milestones_and_unknown_schedules_are_one_line_errors(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\n[defaults]\nmilestones = [0.75, 0.5]\n'
                     '[[run]]\nmethod = "sgd"\n')
    with pytest.raises(FileError, match=r"s.toml: defaults.milestones: .*increasing fractions"):
        expand_suite(suite)
    suite.write_text('name = "s"\nworkload = "digits-mlp"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n'
                     'params = { lr_schedule = "linear" }\n')
    with pytest.raises(FileError, match=r"run\[0\].params.lr_schedule"):
        expand_suite(suite)


class TwoGroups(Method):
    """A method whose optimizer has two param groups with different lrs (a head at 10x)."""

    name, family, summary = "two-groups", "test", "two param groups"

    def __init__(self, ctx):
        super().__init__(ctx)  # the runner reads the run's hyperparameters from ctx.params, as the method does
        self.body, self.head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        self.optimizer = torch.optim.SGD([{"params": self.body.parameters(), "lr": 0.1},
                                          {"params": self.head.parameters(), "lr": 1.0}], lr=0.1)

    def optimizers(self):
        return [self.optimizer]

    def train_step(self, batch):
        return StepStats(loss=0.0)

    def evaluate(self, test):
        return EvalResult(0.0, 0.0)


def spec_of(tmp_path: Path, runs: str, defaults: str, budget: str = f"max_steps = {STEPS}\nmax_epochs = 100"):
    path = tmp_path / "sched.toml"
    path.write_text(f'name = "sched"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                    f"checkpoint_every_steps = 1000\n[budget]\n{budget}\neval_every_epochs = 1\n"
                    f"[defaults]\nbatch_size = 32\nlr = 0.05\nmomentum = 0.9\n{defaults}\n{runs}")
    return expand_suite(path)


def test_the_runner_keeps_the_ratio_of_param_groups(tmp_path):
    spec = spec_of(tmp_path, '[[run]]\nmethod = "sgd"', 'lr_schedule = "step"\nmilestones = [0.5]')[0]
    train = registry.WORKLOADS.get("digits-mlp").instantiate().train
    method = TwoGroups(SimpleNamespace(params=TrainParams.model_validate(spec.params)))
    loop = Loop(spec, method, train, train, comm=None, writer=None, clock=None)
    method.optimizer.param_groups[0]["lr"] = 123.0  # what a restored checkpoint may leave: overwritten
    loop.set_lr(STEPS // 2)
    assert [g["lr"] for g in method.optimizer.param_groups] == pytest.approx([0.01, 0.1])
    assert loop.lr == pytest.approx(0.005)
    loop.set_lr(0)
    assert [g["lr"] for g in method.optimizer.param_groups] == [0.1, 1.0]


def test_a_schedule_on_a_method_without_optimizers_is_refused(tmp_path):
    class Opaque(TwoGroups):
        def optimizers(self):
            return []

    spec = spec_of(tmp_path, '[[run]]\nmethod = "sgd"', 'lr_schedule = "cosine"')[0]
    train = registry.WORKLOADS.get("digits-mlp").instantiate().train
    with pytest.raises(ValueError, match="does not expose its optimizers"):
        Loop(spec, Opaque(SimpleNamespace(params=TrainParams.model_validate(spec.params))), train, train,
             comm=None, writer=None, clock=None)


def run(spec, out: Path) -> Path:
    run_dir = prepare_run_dir(spec, out)
    result = launch(spec, run_dir)
    assert result.state == "completed", result.error
    return run_dir


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(run_dir / checkpoint.CHECKPOINT_FILE)["ranks"][0]["method"]["model"]


def train_by_hand(lr_of_step) -> dict[str, torch.Tensor]:
    """sgd on digits-mlp as the worker seeds it, written out: the lr of step t is lr_of_step(t), or untouched."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        instance = registry.WORKLOADS.get("digits-mlp").instantiate()
        torch.manual_seed(0)
        model = instance.make_model()
        optimizer = make_optimizer(model.parameters(), TrainParams(batch_size=32, lr=0.05, momentum=0.9))
        order = DataOrder(len(instance.train), 32, 0)
        for step in range(STEPS):
            if lr_of_step is not None:
                optimizer.param_groups[0]["lr"] = 0.05 * lr_of_step(step)
            batch = Batch(step, order.epoch_of(step), order.batch(step), instance.train, 0)
            optimizer.zero_grad(set_to_none=True)
            instance.loss(model(batch.inputs()), batch.targets()).backward()
            optimizer.step()
        return model.state_dict()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
def test_a_constant_schedule_leaves_sgd_exactly_as_plain_training(tmp_path):
    spec = spec_of(tmp_path, '[[run]]\nmethod = "sgd"', 'lr_schedule = "constant"')[0]
    assert_same_weights(final_weights(run(spec, tmp_path)), train_by_hand(None))


@pytest.mark.slow
def test_every_method_gets_the_same_lr_at_every_step(tmp_path):
    runs = ('[[run]]\nmethod = "sgd"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n'
            '[[run]]\nmethod = "gpipe"\nparams = { microbatches = 2 }\n'
            '[[run]]\nmethod = "local"\nparams = { chunks = 2 }\n')
    specs = spec_of(tmp_path, runs, 'lr_schedule = "step"\nmilestones = [0.5, 0.75]\nlr_warmup_epochs = 0.25\n'
                                    "lr_warmup_start_factor = 0.2")
    expected = LrSchedule.from_params(TrainParams.model_validate(specs[0].params), 44, STEPS)
    assert expected.warmup_steps == 11 and expected.milestone_steps == (30, 45)
    lrs = {}
    for spec in specs:
        records = read_jsonl(run(spec, tmp_path) / "metrics.jsonl")
        for rank in range(spec.world_size):
            lrs[(spec.method, rank)] = [r["lr"] for r in records if r["kind"] == "train" and r["rank"] == rank]
    wanted = [0.05 * expected.factor(t) for t in range(STEPS)]
    for key, got in lrs.items():
        assert got == wanted, key
    # and the lr is really applied: sgd ends exactly where plain training with the same lr per step ends
    sgd_dir = tmp_path / "sched" / specs[0].run_id
    assert_same_weights(final_weights(sgd_dir), train_by_hand(expected.factor))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["step", "cosine"])
def test_a_schedule_changes_training(tmp_path, kind):
    spec = spec_of(tmp_path, '[[run]]\nmethod = "sgd"', f'lr_schedule = "{kind}"')[0]
    scheduled = final_weights(run(spec, tmp_path))
    plain = train_by_hand(None)
    assert any(not torch.equal(scheduled[name], plain[name]) for name in plain)
    assert not math.isnan(float(next(iter(scheduled.values())).sum()))
