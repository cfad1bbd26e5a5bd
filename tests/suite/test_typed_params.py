"""A run's params are validated once and stay typed: the method's Params from the suite's expansion (or a spec.json's
reading) to the rank, written to spec.json as before; and a spec.json's errors name its field as a suite's do."""

from __future__ import annotations

import json
import pickle

import pytest
from _fuzz import check_outcome, cli, sandbox, snapshot, written
from pydantic import ValidationError

from harness.suite.expand import check_spec, expand_suite
from harness.suite.files import FileError
from harness.suite.spec import RunSpec
from methods.pipeline.pb.pb import PBParams

PB_SUITE = ('name = "t"\nworkload = "digits-mlp"\n[budget]\nmax_steps = 1\n[[run]]\nmethod = "pb"\n'
            'params = { batch_size = 1, lr = 0.05, momentum = 0.9, reference_batch = 32, stages = 3 }\n')


@pytest.fixture
def validations(monkeypatch) -> list[str]:
    """Every validation of PBParams from a dict (model_validate, which from_spec calls too), by caller."""
    calls: list[str] = []
    validate = PBParams.model_validate.__func__

    def counted(cls, obj, *args, **kwargs):
        calls.append(type(obj).__name__)
        return validate(cls, obj, *args, **kwargs)

    monkeypatch.setattr(PBParams, "model_validate", classmethod(counted))
    return calls


def test_the_params_are_validated_once_from_the_suite_to_the_rank(tmp_path, validations):
    path = tmp_path / "s.toml"
    path.write_text(PB_SUITE)
    (spec,) = expand_suite(path)
    assert isinstance(spec.params, PBParams) and len(validations) == 1
    # What the launchers hand each rank (the forkserver's and submitit's pickle) is the typed object, not validated
    # again; nor does `dtbench rerun`'s check of a spec validate its params a second time.
    handed = pickle.loads(pickle.dumps(spec))
    assert isinstance(handed.params, PBParams) and handed == spec
    check_spec(handed, tmp_path / "spec.json")
    assert len(validations) == 1
    # spec.json records the params as their dump always read, derived values beside them; reading it back
    # validates them once, as the method's Params.
    text = spec.model_dump_json()
    assert json.loads(text)["params"] == spec.params.model_dump() and "applied_lr" in json.loads(text)["params"]
    read = RunSpec.model_validate_json(text)
    assert isinstance(read.params, PBParams) and read == spec and len(validations) == 2
    check_spec(read, tmp_path / "spec.json")
    assert len(validations) == 2


def test_a_spec_json_reads_its_params_as_its_methods_naming_the_field():
    with sandbox() as root:
        path = root / "s.toml"
        path.write_text(PB_SUITE)
        (spec,) = expand_suite(path)
    document = json.loads(spec.model_dump_json())
    with pytest.raises(ValidationError) as caught:
        RunSpec.model_validate({**document, "params": {**document["params"], "applied_lr": 0.5}})
    (error,) = caught.value.errors()
    assert error["loc"] == ("params", "applied_lr") and error["msg"].startswith("not what the keys it derives")
    with pytest.raises(ValidationError) as caught:
        RunSpec.model_validate({**document, "params": {**document["params"], "stages": "3"}})
    assert caught.value.errors()[0]["loc"] == ("params", "stages")
    with pytest.raises(ValidationError) as caught:
        RunSpec.model_validate({**document, "method": "no-such-method"})
    assert caught.value.errors()[0]["loc"] == ("method",)
    assert "unknown method 'no-such-method'" in caught.value.errors()[0]["msg"]


def test_a_suite_and_a_spec_json_name_a_bad_workload_option_alike(tmp_path):
    """One set of checks (harness/suite/checks.py check_run): a suite's run and a spec.json are refused for the same
    option, each naming its own file's field."""
    path = tmp_path / "s.toml"
    path.write_text('name = "t"\nworkload = "digits-cnn"\n[budget]\nmax_steps = 1\n[[run]]\nmethod = "sgd"\n'
                    'workload_options = { norm = "layer" }\n')
    with pytest.raises(FileError) as suite_error:
        expand_suite(path)
    assert str(suite_error.value).startswith(f"{path}: run[0].workload_options.norm: Input should be 'none' or")
    path.write_text(path.read_text().replace('"layer"', '"group"'))
    (spec,) = expand_suite(path)
    bad = spec.model_copy(update={"workload_options": {"norm": "layer"}})
    with pytest.raises(FileError) as spec_error:
        check_spec(bad, tmp_path / "spec.json")
    assert str(spec_error.value).startswith(f"{tmp_path / 'spec.json'}: workload_options.norm: Input should be 'none'")
    assert str(spec_error.value).split(": ", 2)[2] == str(suite_error.value).split(": ", 2)[2]


def test_rerun_of_a_spec_json_whose_derived_value_was_edited_is_one_line():
    with sandbox() as root:
        path = root / "s.toml"
        path.write_text(PB_SUITE)
        (spec,) = expand_suite(path)
        document = json.loads(spec.model_dump_json())
        document["params"]["applied_lr"] = 0.5
        run = root / "in" / "run"
        run.mkdir(parents=True)
        (run / "spec.json").write_text(json.dumps(document))
        before = snapshot(root)
        code, out, err = cli(["rerun", str(run), "--out", "out", "--quiet"], root)
        check_outcome(code, err, names=str(run / "spec.json"))
        assert code == 2 and f"{run / 'spec.json'}: params.applied_lr: not what the keys it derives from" in err, err
        assert written(before, snapshot(root)) == []
