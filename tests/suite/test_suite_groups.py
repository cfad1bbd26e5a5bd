"""Suite groups ([[group]], [[group.run]]): the runs they stand for, precedence, baselines, and one-line errors."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.suite.expand import check_spec, expand_suite
from harness.suite.files import FileError
from harness.suite.spec import RunSpec

HEAD = """
name = "t"
workload = "digits-mlp"
seeds = [0, 1]
[budget]
max_epochs = 2
eval_every_epochs = 1
[defaults]
lr = 0.1
"""

FLAT = HEAD + """
[[run]]
method = "sgd"
[[run]]
method = "sgd"
workload = "digits-cnn"
workload_options = { norm = "group" }
params = { batch_size = 16, momentum = 0.5 }
budget = { max_epochs = 1 }
[[run]]
method = "ddp"
world_size = 2
workload = "digits-cnn"
workload_options = { norm = "group" }
params = { batch_size = 16, momentum = 0.5, lr = 0.2 }
budget = { max_epochs = 1 }
"""

GROUPED = HEAD + """
[[run]]
method = "sgd"
[[group]]
workload = "digits-cnn"
workload_options = { norm = "group" }
budget = { max_epochs = 1 }
defaults = { batch_size = 16, momentum = 0.5 }
baseline = "ddp"
[[group.run]]
method = "sgd"
[[group.run]]
method = "ddp"
world_size = 2
params = { lr = 0.2 }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(textwrap.dedent(text))
    return path


def without_baseline(specs: list[RunSpec]) -> list[dict]:
    return [spec.model_dump(exclude={"baseline"}) for spec in specs]


def test_a_group_expands_to_the_runs_it_stands_for(tmp_path):
    flat = expand_suite(write(tmp_path, FLAT))
    grouped = expand_suite(write(tmp_path, GROUPED))  # the same path: suite_file is equal too
    assert without_baseline(grouped) == without_baseline(flat)
    assert [spec.baseline for spec in grouped] == [None, None, "ddp", "ddp", "ddp", "ddp"]
    assert [spec.model_dump_json(exclude={"baseline"}) for spec in grouped] == \
        [spec.model_dump_json(exclude={"baseline"}) for spec in flat]  # key order too (spec hashes)


def test_top_level_runs_expand_first_then_each_group_in_order(tmp_path):
    text = HEAD + """
    [[group]]
    workload = "digits-cnn"
    [[group.run]]
    method = "ddp"
    world_size = 2
    [[group.run]]
    method = "sgd"
    [[group]]
    workload = "digits-mlp"
    defaults = { lr = 0.3 }
    [[group.run]]
    method = "sgd"
    [[run]]
    method = "fp16"
    world_size = 2
    """
    specs = expand_suite(write(tmp_path, text))
    assert [(s.method, s.workload, s.seed) for s in specs] == [
        ("fp16", "digits-mlp", 0), ("fp16", "digits-mlp", 1),
        ("ddp", "digits-cnn", 0), ("ddp", "digits-cnn", 1), ("sgd", "digits-cnn", 0), ("sgd", "digits-cnn", 1),
        ("sgd", "digits-mlp", 0), ("sgd", "digits-mlp", 1)]
    assert specs[-1].params.lr == 0.3 and specs[-1].run_id == "sgd-digits-mlp-w1-lr0.3-s1"


def test_precedence_suite_then_group_then_run(tmp_path):
    text = HEAD.replace("lr = 0.1", "lr = 0.1\nweight_decay = 0.01\nmomentum = 0.8") + """
    [[group]]
    workload = "digits-cnn"
    workload_options = { norm = "group" }
    budget = { max_epochs = 1, target_accuracy = 0.5 }
    defaults = { lr = 0.2, momentum = 0.5 }
    [[group.run]]
    method = "sgd"
    [[group.run]]
    method = "sgd"
    label = "own"
    workload_options = { norm = "none" }
    params = { lr = 0.3 }
    budget = { eval_every_steps = 5 }
    """
    first, _, own, _ = expand_suite(write(tmp_path, text))
    assert first.params.lr == 0.2 and own.params.lr == 0.3  # group defaults over the suite's; run params over
    assert first.params.momentum == own.params.momentum == 0.5  # both the group's
    assert first.params.weight_decay == own.params.weight_decay == 0.01  # the suite's [defaults]
    assert first.params.batch_size == 32  # the workload's
    assert first.workload_options["norm"] == "group" and own.workload_options["norm"] == "none"
    assert first.budget.max_epochs == own.budget.max_epochs == 1  # the group's over the suite's 2
    assert first.budget.target_accuracy == own.budget.target_accuracy == 0.5  # the group's over the workload's
    assert first.budget.eval_every_epochs == 1 and first.budget.eval_every_steps is None  # the suite's cadence
    assert own.budget.eval_every_steps == 5 and own.budget.eval_every_epochs is None  # the run's replaces it


def test_a_suite_of_groups_alone_needs_no_top_level_workload_nor_runs(tmp_path):
    text = """
    name = "t"
    [[group]]
    workload = "digits-mlp"
    baseline = "sgd x1"
    [[group.run]]
    method = "sgd"
    [[group.run]]
    method = "ddp"
    world_size = 2
    """
    specs = expand_suite(write(tmp_path, text))
    assert [spec.run_id for spec in specs] == ["sgd-digits-mlp-w1-s0", "ddp-digits-mlp-w2-s0"]
    assert {spec.baseline for spec in specs} == {"sgd x1"}  # a default label names the baseline too


def test_baseline_by_label_and_the_top_level_baseline(tmp_path):
    text = GROUPED.replace('baseline = "ddp"', 'baseline = "reference"').replace(
        '[[group.run]]\nmethod = "sgd"', '[[group.run]]\nmethod = "sgd"\nlabel = "reference"')
    text = text.replace('name = "t"', 'name = "t"\nbaseline = "sgd"')
    specs = expand_suite(write(tmp_path, text))
    assert [spec.baseline for spec in specs] == ["sgd", "sgd", "reference", "reference", "reference", "reference"]


def test_baseline_lands_in_spec_json_and_an_old_spec_json_still_reads(tmp_path):
    spec = expand_suite(write(tmp_path, GROUPED))[2]
    assert spec.baseline == "ddp"
    text = spec.model_dump_json()
    assert json.loads(text)["baseline"] == "ddp"
    assert RunSpec.model_validate_json(text) == spec
    check_spec(RunSpec.model_validate_json(text), tmp_path / "spec.json")
    old = json.loads(text)
    del old["baseline"]  # a spec.json written before the key existed
    read = RunSpec.model_validate_json(json.dumps(old))
    assert read.baseline is None and read.model_dump(exclude={"baseline"}) == spec.model_dump(exclude={"baseline"})
    check_spec(read, tmp_path / "spec.json")


def test_dry_run_lists_group_runs_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path, GROUPED)), "--out", str(out), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "6 runs" in printed and "\tddp\tdigits-cnn\tworld_size=2\t" in printed
    assert not out.exists()


GROUP_RUN_ERRORS = [
    ("group run names a workload", GROUPED.replace('world_size = 2\nparams', 'world_size = 2\nworkload = "digits-mlp"'
                                                   '\nparams'), "group[0].run[1].workload: a group's runs take"),
    ("bad group baseline", GROUPED.replace('baseline = "ddp"', 'baseline = "dpp"'),
     "group[0].baseline: no run of this group has the label or method 'dpp' (labels: sgd x1, ddp x2; methods: sgd, "
     "ddp)"),
    ("bad top-level baseline", GROUPED.replace('name = "t"', 'name = "t"\nbaseline = "ddp"'),
     "baseline: no top-level [[run]] has the label or method 'ddp' (labels: sgd x1; methods: sgd)"),
    ("group default of no method", GROUPED.replace("momentum = 0.5 }", "momentum = 0.5, bits = 4 }"),
     "group[0].defaults.bits: not a parameter of method 'sgd' used by group[0].run[0] (its parameters: "),
    ("bad run param", GROUPED.replace("lr = 0.2", "lr = -1"), "group[0].run[1].params.lr: Input should be greater"),
    ("bad group default", GROUPED.replace("momentum = 0.5 }", "momentum = -1.0 }"), "group[0].defaults.momentum"),
    ("bad suite default", GROUPED.replace("lr = 0.1", "lr = -1.0"), "defaults.lr: Input should be greater"),
    ("world size", GROUPED.replace('method = "sgd"\n[[group.run]]', 'method = "sgd"\nworld_size = 2\n[[group.run]]'),
     "group[0].run[0].world_size"),
    ("unknown group key", GROUPED.replace('baseline = "ddp"', 'baseline = "ddp"\ncolour = "red"'),
     "group[0].colour: unknown key"),
    ("unknown group run key", GROUPED.replace("params = { lr = 0.2 }", "parms = { lr = 0.2 }"),
     "group[0].run[1].parms: unknown key"),
    ("group without workload", GROUPED.replace('workload = "digits-cnn"\n', ""), "group[0].workload: required key"),
    ("group without runs", HEAD + '[[group]]\nworkload = "digits-cnn"\n', "group[0].run: required key is missing"),
    ("unknown group workload", GROUPED.replace('"digits-cnn"', '"mnist"'), "group[0].workload: unknown workload"),
    ("bad group option", GROUPED.replace('norm = "group"', 'norm = "batchy"'), "group[0].workload_options.norm"),
    ("bad run option", GROUPED.replace("world_size = 2\nparams", 'world_size = 2\nworkload_options = { norm = 1 }\n'
                                       "params"), "group[0].run[1].workload_options.norm"),
    ("duplicate group run", GROUPED + '[[group.run]]\nmethod = "sgd"\n', "group[0].run[2]: duplicates group[0].run[0]"),
    ("threads", GROUPED.replace("world_size = 2\nparams", "world_size = 2\nthreads_per_rank = 0\nparams"),
     "group[0].run[1].threads_per_rank"),
    ("stages past the blocks", GROUPED.replace('method = "ddp"\nworld_size = 2', 'method = "gpipe"\nworld_size = 8'),
     "group[0].run[1].world_size: 8 stages need at least 8 blocks"),
    ("warm-up from group defaults", GROUPED.replace(
        "budget = { max_epochs = 1 }", "budget = { max_steps = 10 }").replace(
        "momentum = 0.5 }", 'momentum = 0.5, lr_schedule = "cosine", lr_warmup_steps = 10 }'),
     "group[0].defaults.lr_warmup_steps: a warm-up of 10 steps"),
    ("neither runs nor groups", 'name = "t"\nworkload = "digits-mlp"\n',
     "run: required key is missing: the suite has no runs"),
    ("empty run list", 'name = "t"\nworkload = "digits-mlp"\nrun = []\n', "run: required key is missing"),
    ("top-level run without a workload", GROUPED.replace('workload = "digits-mlp"\n', "", 1),
     "run[0].workload: required key is missing (the suite names no workload)"),
    ("suite options without a workload", 'name = "t"\nworkload_options = { depth = 2 }\n[[group]]\n'
     'workload = "digits-mlp"\n[[group.run]]\nmethod = "sgd"\n', "workload_options: options of the suite's workload"),
]


@pytest.mark.parametrize("case,text,expected", GROUP_RUN_ERRORS, ids=[c[0] for c in GROUP_RUN_ERRORS])
def test_a_bad_group_gives_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(FileError) as err:
        expand_suite(path)
    assert expected in str(err.value) and str(err.value).startswith(f"{path}: ")
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--dry-run"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and str(path) in stderr and expected in stderr
    assert not out.exists()
