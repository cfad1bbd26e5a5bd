"""Suite files: expansion, precedence, run ids, and one clear line (file and field) with exit 2 for bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.suite.expand import expand_suite
from harness.suite.files import FileError
from harness.suite.spec import make_run_id

GOOD = """
name = "t"
workload = "digits-mlp"
seeds = [0, 1]
[budget]
max_epochs = 2
eval_every_epochs = 1
[defaults]
lr = 0.1
[[run]]
method = "sgd"
[[run]]
method = "ddp"
world_size = 2
params = { lr = 0.2 }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_expands_runs_times_seeds_with_precedence(tmp_path):
    specs = expand_suite(write(tmp_path, GOOD))
    assert [s.run_id for s in specs] == ["sgd-digits-mlp-w1-s0", "sgd-digits-mlp-w1-s1",
                                         "ddp-digits-mlp-w2-lr0.2-s0", "ddp-digits-mlp-w2-lr0.2-s1"]
    sgd, ddp = specs[0], specs[2]
    assert sgd.params.lr == 0.1  # suite defaults over workload defaults
    assert ddp.params.lr == 0.2  # run params over suite defaults
    assert sgd.params.batch_size == 32 and sgd.params.momentum == 0.9  # workload defaults
    assert sgd.budget.max_epochs == 2 and sgd.budget.target_accuracy == 0.95  # workload fills unset budget fields
    assert ddp.threads_per_rank >= 1


BAD = [
    ("unknown top-level key", GOOD + "colour = 'red'\n", "colour: unknown key"),
    ("unknown run key", GOOD.replace('method = "sgd"', 'method = "sgd"\nwrold_size = 1'), "run[0].wrold_size"),
    ("unknown method", GOOD.replace('"sgd"', '"sgdd"'), "run[0].method: unknown method 'sgdd'"),
    ("unknown workload", GOOD.replace('"digits-mlp"', '"mnist"'), "workload: unknown workload 'mnist'"),
    ("bad type", GOOD.replace("seeds = [0, 1]", "seeds = 'zero'"), "seeds"),
    ("bad param type", GOOD.replace("lr = 0.2", "lr = 'fast'"), "run[1].params.lr"),
    ("unknown param", GOOD.replace("lr = 0.2", "lrr = 0.2"), "run[1].params.lrr: unknown key"),
    ("unknown default", GOOD.replace("lr = 0.1", "bits = 4"), "defaults.bits"),
    ("world size sgd", GOOD.replace('method = "sgd"', 'method = "sgd"\nworld_size = 2'), "run[0].world_size"),
    ("indivisible batch", GOOD.replace("world_size = 2", "world_size = 3"), "run[1].world_size: batch_size 32"),
    ("negative lr", GOOD.replace("lr = 0.2", "lr = -1"), "run[1].params.lr"),
    ("two cadences", GOOD.replace("eval_every_epochs = 1", "eval_every_epochs = 1\neval_every_seconds = 2"),
     "budget"),
    ("duplicate run", GOOD + '[[run]]\nmethod = "sgd"\n', "run[2]: duplicates run[0]"),
    ("not toml", "name = \n", "not valid TOML"),
    ("no runs", 'name = "t"\nworkload = "digits-mlp"\n', "run: required key is missing"),
    ("bad name", GOOD.replace('name = "t"', 'name = "../x"'), "name"),
]


@pytest.mark.parametrize("case,text,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_suite_gives_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(FileError) as err:
        expand_suite(path)
    assert expected in str(err.value)
    assert str(path) in str(err.value)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and str(path) in stderr and expected in stderr
    assert not out.exists()


def test_missing_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "nope.toml: cannot read suite file" in capsys.readouterr().err


def test_dry_run_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path, GOOD)), "--out", str(out), "--dry-run"]) == 0
    assert "4 runs" in capsys.readouterr().out
    assert not out.exists()


def test_only_filters_by_glob(tmp_path):
    assert [s.run_id for s in expand_suite(write(tmp_path, GOOD), only="ddp*s1")] == ["ddp-digits-mlp-w2-lr0.2-s1"]


def test_run_ids_are_filesystem_safe_and_distinct():
    plain = make_run_id("qsgd", "digits-mlp", 2, {"bits": 4}, 0)
    assert plain == "qsgd-digits-mlp-w2-bits4-s0"
    unsafe = [make_run_id("m", "w", 1, {"path": p}, 0) for p in ("../../etc", "a/b", "a b", "a\\b", "a:b*?")]
    for run_id in unsafe:
        assert all(c.isalnum() or c in "._-" for c in run_id), run_id
        assert not run_id.startswith((".", "-")) and ".." not in run_id.split("-")[0]
    assert len(set(unsafe)) == len(unsafe)  # sanitising never merges distinct runs
    assert make_run_id("m", "w", 1, {"p": "a/b"}, 0) == make_run_id("m", "w", 1, {"p": "a/b"}, 0)  # stable
    long_id = make_run_id("m", "w", 1, {f"k{i}": "v" * 20 for i in range(20)}, 0)
    assert len(long_id) <= 80 and long_id.startswith("m-w-w1-k0") and len(set(long_id.split("-")[-1])) > 1


def test_label_names_the_group(tmp_path):
    text = GOOD.replace('method = "sgd"', 'method = "sgd"\nlabel = "reference sgd"')
    spec = expand_suite(write(tmp_path, text))[0]
    assert spec.label == "reference sgd" and spec.run_id.startswith("reference_sgd-digits-mlp")


def test_smoke_suite_is_valid(repo_root):
    specs = expand_suite(repo_root / "suites" / "smoke.toml")
    assert {"sgd", "ddp"} <= {s.method for s in specs}


def test_run_budget_overrides_suite_and_workload_fill_the_rest(tmp_path):
    text = GOOD.replace('method = "sgd"', 'method = "sgd"\nbudget = { eval_every_seconds = 2.0 }')
    sgd = expand_suite(write(tmp_path, text))[0]
    assert sgd.budget.eval_every_seconds == 2.0 and sgd.budget.eval_every_epochs is None  # the run's cadence wins
    assert sgd.budget.max_epochs == 2  # from the suite
    assert sgd.budget.target_accuracy == 0.95  # from the workload
