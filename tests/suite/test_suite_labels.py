"""Default labels: the method, what sets a run apart from its method's other runs on the workload, the optimizer
when it is not the suite's, the world size; at most 40 characters; run ids at most 80; one label per run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from harness.report import page
from harness.suite.expand import expand_suite
from harness.suite.files import FileError
from harness.suite.labels import MAX_LABEL, LabelInputs, default_labels
from harness.suite.spec import MAX_RUN_ID

REPO = Path(__file__).resolve().parents[2]

HEAD = """
name = "t"
workload = "digits-mlp"
[budget]
max_epochs = 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(textwrap.dedent(text))
    return path


def labels_of(tmp_path: Path, text: str) -> list[str]:
    return [spec.label for spec in expand_suite(write(tmp_path, text))]


def test_a_run_names_where_it_departs_from_its_methods_other_runs(tmp_path):
    text = HEAD + "".join(f"""
    [[run]]
    method = "qfb"
    world_size = 2
    params = {{ microbatches = 4{extra} }}
    """ for extra in ("", ", feedback = false", ', sync = "bounded"', ', activation_codec = "none"', ", lanes = 1"))
    assert labels_of(tmp_path, text) == ["qfb x2", "qfb feedback=0 x2", "qfb sync=bounded x2",
                                         "qfb activation_codec=none x2", "qfb lanes=1 x2"]


def test_params_shared_by_all_of_a_methods_runs_say_nothing_and_world_size_always_shows(tmp_path):
    text = HEAD + """
    [[run]]
    method = "qsgd"
    world_size = 2
    params = { bits = 4 }
    [[run]]
    method = "pipedream"
    world_size = 2
    [[run]]
    method = "pipedream"
    world_size = 3
    params = { replicas = [2, 1] }
    [[run]]
    method = "sgd"
    """
    assert labels_of(tmp_path, text) == ["qsgd x2", "pipedream x2", "pipedream replicas=2+1 x3", "sgd x1"]


def test_the_optimizer_shows_when_it_is_not_the_suites(tmp_path):
    text = HEAD + """
    [[run]]
    method = "ddp"
    world_size = 2
    [[run]]
    method = "sgd"
    [[group]]
    workload = "shakespeare-gpt"
    workload_options = { n_layer = 1, n_head = 1, d_model = 8, context = 8 }
    budget = { max_steps = 2 }
    defaults = { batch_size = 4, lr = 3e-3, momentum = 0.0, lr_warmup_steps = 0 }
    [[group.run]]
    method = "ddp"
    world_size = 2
    [[group.run]]
    method = "sgd"
    """
    # The digits runs take momentum SGD (the suite's: most of its runs'); the GPT workload's hyperparameters AdamW.
    assert labels_of(tmp_path, text) == ["ddp x2", "sgd x1", "ddp adamw x2", "sgd adamw x1"]
    # A suite whose [defaults] name AdamW: the momentum-SGD runs say so, and not as the method 'sgd'.
    adamw = HEAD + """
    [defaults]
    optimizer = "adamw"
    [[run]]
    method = "ddp"
    world_size = 2
    [[run]]
    method = "ddp"
    world_size = 2
    params = { optimizer = "sgd" }
    """
    assert labels_of(tmp_path, adamw) == ["ddp x2", "ddp optim=sgd x2"]


def test_a_long_label_is_cut_with_a_digest_and_stays_distinct():
    runs = [LabelInputs("interleaved-1f1b", "w", 2, {"microbatches": m, "activation_checkpointing_policy": p})
            for m, p in ((4, "none"), (8, "every_block_but_the_last"), (16, "every_block_but_the_first"))]
    labels = default_labels(runs, "sgd")
    assert labels[0] == "interleaved-1f1b x2"
    assert all(len(label) <= MAX_LABEL for label in labels), labels
    assert len(set(labels)) == 3
    for label in labels[1:]:
        assert label.startswith("interleaved-1f1b ") and label.endswith(" x2") and "… #" in label


def test_two_runs_under_one_label_on_a_workload_are_an_error(tmp_path):
    text = HEAD + """
    [[run]]
    method = "ddp"
    world_size = 2
    params = { lr = 0.1 }
    label = "ours"
    [[run]]
    method = "ddp"
    world_size = 2
    params = { lr = 0.2 }
    label = "ours"
    """
    with pytest.raises(FileError) as err:
        expand_suite(write(tmp_path, text))
    assert str(err.value) == (f"{tmp_path / 'suite.toml'}: run[1].label: 'ours' also names run[0] on workload "
                              "'digits-mlp'; give one of them a distinct label")


def test_one_label_on_two_workloads_is_two_groups(tmp_path):
    text = HEAD + """
    [[run]]
    method = "ddp"
    world_size = 2
    [[run]]
    method = "ddp"
    world_size = 2
    workload = "digits-cnn"
    """
    assert labels_of(tmp_path, text) == ["ddp x2", "ddp x2"]


@pytest.mark.parametrize("suite", sorted(p.name for p in (REPO / "suites").glob("*.toml")
                                         if not p.name.endswith(".claims.toml")))
def test_every_shipped_suite_has_short_labels_and_ids(suite):
    specs = expand_suite(REPO / "suites" / suite)
    for spec in specs:
        label = spec.label.split(" @ ")[0]
        assert len(label) <= MAX_LABEL, (suite, spec.label)
        assert len(spec.run_id) <= MAX_RUN_ID, (suite, spec.run_id)


def test_the_per_label_table_gives_each_label_its_full_params_as_a_tooltip():
    spec = {"method": "qsgd", "world_size": 2, "workload": "digits-mlp", "label": "qsgd x2",
            "workload_options": {}, "params": {"bits": 4, "lr": 0.05}}
    setups = page.label_setups([spec, {**spec, "params": {"bits": 8}}])
    assert setups == {("digits-mlp", "qsgd x2"): "qsgd x2 on digits-mlp; params: bits=4, lr=0.05"}
    shown = pd.DataFrame({"workload": ["digits-mlp", "digits-mlp"], "label": ["qsgd x2", "<b>odd</b>"],
                          "final accuracy": ["0.9 [0.8, 1.0]", "<i>"]})
    html = page.with_tooltips(shown, setups)
    assert '<span class="setup" title="qsgd x2 on digits-mlp; params: bits=4, lr=0.05">qsgd x2</span>' in html
    assert "&lt;b&gt;odd&lt;/b&gt;" in html and "&lt;i&gt;" in html and "<b>" not in html  # every cell escaped
