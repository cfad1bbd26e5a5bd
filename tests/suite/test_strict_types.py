"""Suite types are strict: a string where a number or bool belongs is one line naming the file and the field (exit 2,
nothing written), at every level (top, budget, defaults, run, params, workload_options); an int for a float stays."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_config import GOOD, write

from harness.cli import main
from harness.method import TrainParams
from harness.registry import METHODS
from harness.suite.expand import expand_suite
from harness.suite.files import FileError

#: (case, the edit of GOOD, the field the error must name, what it must say)
WRONG_TYPES = [
    ("world size as a string", ('world_size = 2', 'world_size = "2"'), "run[1].world_size", "valid integer"),
    ("lr as a string in defaults", ("lr = 0.1", 'lr = "0.05"'), "defaults.lr", "valid number"),
    ("lr as a string in params", ("lr = 0.2", 'lr = "0.2"'), "run[1].params.lr", "valid number"),
    ("deterministic as a string", ('seeds = [0, 1]', 'seeds = [0, 1]\ndeterministic = "yes"'), "deterministic",
     "true or false"),
    ("batch size as a float", ("lr = 0.1", "batch_size = 32.0"), "defaults.batch_size", "valid integer"),
    ("budget as a string", ("max_epochs = 2", 'max_epochs = "2"'), "budget.max_epochs", "valid number"),
    ("seed as a float", ("seeds = [0, 1]", "seeds = [0, 1.0]"), "seeds[1]", "valid integer"),
    ("a bool param as an int", ("lr = 0.2", "nesterov = 1"), "run[1].params.nesterov", "valid boolean"),
    ("threads as a string", ('world_size = 2', 'world_size = 2\nthreads_per_rank = "1"'), "run[1].threads_per_rank",
     "valid integer or a valid list"),
    ("a method's own param as a string", ('method = "ddp"\nworld_size = 2\nparams = { lr = 0.2 }',
                                           'method = "qsgd"\nworld_size = 2\nparams = { bits = "4" }'),
     "run[1].params.bits", "'4'"),
    ("workload option as a string",
     ('method = "sgd"', 'method = "sgd"\nworkload = "digits-resnet"\nworkload_options = { depth = "8" }'),
     "run[0].workload_options.depth", "valid integer"),
]


@pytest.mark.parametrize("case,edit,field,says", WRONG_TYPES, ids=[c[0] for c in WRONG_TYPES])
def test_a_wrong_type_is_one_line_naming_file_and_field_exit_2_nothing_written(tmp_path, capsys, case, edit, field,
                                                                                 says):
    old, new = edit
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(FileError) as err:
        expand_suite(path)
    assert str(err.value).startswith(f"{path}: {field}: ") and says in str(err.value)
    out = tmp_path / "out"
    for extra in (["--dry-run"], []):
        assert main(["run", str(path), "--out", str(out), *extra]) == 2
        stderr = capsys.readouterr().err
        assert stderr.count("\n") == 1 and f"{path}: {field}: " in stderr
    assert not out.exists()


def test_an_int_where_a_float_belongs_is_accepted(tmp_path):
    text = GOOD.replace("lr = 0.1", "lr = 1").replace("max_epochs = 2", "max_epochs = 2\nmax_train_seconds = 60")
    sgd = expand_suite(write(tmp_path, text))[0]
    assert sgd.params.lr == 1.0 and isinstance(sgd.params.lr, float)
    assert sgd.budget.max_train_seconds == 60.0


@pytest.mark.parametrize("method", ["sgd", "qsgd", "gpipe", "local"])
def test_every_methods_params_are_strict_through_the_base_config(method):
    params = METHODS.get(method).Params
    assert issubclass(params, TrainParams)
    for field, wrong in (("lr", "0.05"), ("batch_size", 32.0), ("nesterov", "yes"), ("batch_size", "32")):
        with pytest.raises(ValidationError):
            params.model_validate({field: wrong})
    assert params.model_validate({"lr": 1}).lr == 1.0
