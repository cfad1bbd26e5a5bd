"""One validator for a run's keys, before anything runs: the schedule against the budget, unknown keys with the
nearest known one, type errors without odd advice, and field errors that name the run's method."""

from __future__ import annotations

import pytest

from harness.suite.expand import expand_suite
from harness.suite.files import FileError

SUITE = """name = "v"
workload = "digits-mlp"
seeds = [0]
[budget]
{budget}
[defaults]
batch_size = 32
{defaults}
[[run]]
method = "sgd"
[[run]]
method = "{method}"
world_size = 2
{params}
"""


def suite(tmp_path, budget="max_epochs = 1", defaults="", method="ddp", params=""):
    path = tmp_path / "v.toml"
    path.write_text(SUITE.format(budget=budget, defaults=defaults, method=method, params=params))
    return path


def test_a_cosine_warm_up_longer_than_the_budget_is_exit_2_with_nothing_written(tmp_path, dtbench_here):
    """lr_schedule = "cosine" with a 2-epoch warm-up in a 1-epoch budget used to pass validation and fail every run
    at rank 0 after writing its folder."""
    path = suite(tmp_path, defaults='lr_schedule = "cosine"\nlr_warmup_epochs = 2')
    with pytest.raises(FileError, match=r"defaults\.lr_warmup_epochs: a warm-up of 2 epochs leaves the cosine "
                                        r"schedule none of the budget's 1 epochs"):
        expand_suite(path)
    result = dtbench_here("run", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and not (tmp_path / "out").exists()
    assert len(result.stderr.strip().splitlines()) == 1 and str(path) in result.stderr
    path = suite(tmp_path, defaults='lr_schedule = "cosine"\nlr_warmup_epochs = 0.5')
    assert len(expand_suite(path)) == 2


@pytest.mark.parametrize("budget, defaults, params, wanted", [
    ("max_epoch = 1", "", "", "budget.max_epoch: unknown key (did you mean max_epochs?)"),
    ("max_epochs = 1", "", "params = { microbatch = 4 }", "run[1].params.microbatch: unknown key (did you mean "
                                                          "microbatches?)"),
    ("max_epochs = 1", "momentun = 0.9", "", "defaults.momentun: not a parameter of method 'sgd' used by run[0] "
                                            "(did you mean momentum?"),
    ("max_epochs = 1", "", "params = { zzz = 1 }", "run[1].params.zzz: unknown key (run run[1], method 'gpipe')"),
])
def test_an_unknown_key_names_the_nearest_known_one(tmp_path, budget, defaults, params, wanted):
    with pytest.raises(FileError) as caught:
        expand_suite(suite(tmp_path, budget=budget, defaults=defaults, method="gpipe", params=params))
    assert wanted in str(caught.value) and "\n" not in str(caught.value)


def test_a_type_error_says_what_was_expected_and_advises_only_where_it_applies(tmp_path):
    with pytest.raises(FileError) as caught:
        expand_suite(suite(tmp_path, defaults='lr = "fast"'))
    message = str(caught.value)
    assert "defaults.lr: Input should be a valid number (got 'fast')" in message and "quotes" not in message
    with pytest.raises(FileError, match=r"defaults\.lr: .*\(got '0\.05'\): write it without quotes"):
        expand_suite(suite(tmp_path, defaults='lr = "0.05"'))


def test_a_field_error_names_the_runs_method(tmp_path):
    with pytest.raises(FileError) as caught:
        expand_suite(suite(tmp_path, method="qsgd", params="params = { bits = 0 }"))
    assert "run[1].params.bits:" in str(caught.value) and "method 'qsgd'" in str(caught.value)
    with pytest.raises(FileError) as caught:
        expand_suite(suite(tmp_path, method="ddp", params="params = { batch_size = 31 }"))
    assert "run[1].world_size:" in str(caught.value) and "(method 'ddp')" in str(caught.value)
