"""`dtbench run --dry-run`: each run's resolved params, and what the real run would do with each run folder."""

from __future__ import annotations

import json

import torch
from test_config import GOOD, write

from harness.cli import main
from harness.cli.dry_run import changed_params
from harness.run import checkpoint, checkpoint_files
from harness.suite.expand import expand_suite


def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_each_run_shows_the_params_that_differ_from_its_methods_defaults(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--dry-run"]) == 0
    lines = _lines(capsys)
    sgd = next(line for line in lines if line.startswith("sgd-digits-mlp-w1-s0\t"))
    ddp = next(line for line in lines if line.startswith("ddp-digits-mlp-w2-lr0.2-s0\t"))
    # lr from the suite's [defaults] (sgd) or the run's params (ddp); momentum from the workload; batch_size 32 is
    # the method's own default, so it is not listed.
    assert "params: lr=0.1 momentum=0.9\t" in sgd and "params: lr=0.2 momentum=0.9\t" in ddp
    assert "batch_size" not in sgd
    assert not out.exists()


def test_changed_params_are_those_the_spec_records_unlike_the_defaults(tmp_path):
    sgd, _, ddp, _ = expand_suite(write(tmp_path, GOOD))
    assert changed_params(sgd) == {"lr": 0.1, "momentum": 0.9}
    assert changed_params(ddp) == {"lr": 0.2, "momentum": 0.9}
    assert all(getattr(sgd.params, k) == v for k, v in changed_params(sgd).items())


def test_a_dry_run_says_which_run_folders_the_real_run_would_replace(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    out = tmp_path / "out"
    main(["run", str(path), "--out", str(out), "--dry-run"])
    assert _lines(capsys)[-1] == f"The real run would write 4 new run folders in {out / 't'}."
    for run_id in ("sgd-digits-mlp-w1-s0", "ddp-digits-mlp-w2-lr0.2-s1"):
        (out / "t" / run_id).mkdir(parents=True)
    (out / "t" / "other-run-not-in-the-suite").mkdir()
    before = sorted(p.name for p in (out / "t").iterdir())
    assert main(["run", str(path), "--out", str(out), "--dry-run"]) == 0
    lines = _lines(capsys)
    assert lines[0].startswith("sgd-digits-mlp-w1-s0\t") and lines[0].endswith(
        "\t[replaces an earlier run (moved aside)]")
    assert lines[1].endswith("\t[new]")
    assert lines[-1] == (f"The real run would replace 2 earlier, write 2 new in {out / 't'}; 2 earlier folders would "
                         f"be moved aside to {out / 't'}/.earlier/<date>/.")
    assert sorted(p.name for p in (out / "t").iterdir()) == before  # nothing written, nothing removed
    # Completed results: the real run would refuse them without --resume or --overwrite, and the dry run says so.
    (out / "t" / "sgd-digits-mlp-w1-s0" / "status.json").write_text(json.dumps({"state": "completed"}))
    assert main(["run", str(path), "--out", str(out), "--dry-run"]) == 0
    last = _lines(capsys)[-1]
    assert last.startswith(f"The real run would refuse: {out / 't'}: holds completed results of 1 of these 4 runs")
    assert "--resume" in last and "--overwrite" in last
    assert main(["run", str(path), "--out", str(out), "--dry-run", "--overwrite"]) == 0
    assert _lines(capsys)[-1].startswith("The real run would replace 2 earlier, write 2 new")


def test_with_resume_a_dry_run_says_which_runs_are_skipped_resumed_or_started_over(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    out = tmp_path / "out"
    specs = {spec.run_id: spec for spec in expand_suite(path)}
    completed, resumed, restarted = (out / "t" / run_id for run_id in
                                     ("sgd-digits-mlp-w1-s0", "sgd-digits-mlp-w1-s1", "ddp-digits-mlp-w2-lr0.2-s0"))
    for run_dir in (completed, resumed, restarted):
        run_dir.mkdir(parents=True)
        spec = specs[run_dir.name]
        (run_dir / "spec.json").write_text(json.dumps(spec.model_dump(mode="json")))
    (completed / "status.json").write_text(json.dumps({"state": "completed"}))
    (restarted / "status.json").write_text(json.dumps({"state": "failed"}))
    spec_json = specs[resumed.name].model_dump_json()
    state = {"format": checkpoint.FORMAT_VERSION, "spec": spec_json, "step": 7, "metrics_bytes": 0,
             "ranks": [{"w": torch.zeros(4)}]}
    checkpoint_files.write(resumed, state, checkpoint_files.spec_hash(spec_json))

    assert main(["run", str(path), "--out", str(out), "--dry-run", "--resume"]) == 0
    lines = _lines(capsys)
    assert lines[0].endswith("\t[completed earlier: skipped (--resume)]")
    assert lines[1].endswith("\t[resuming from its checkpoint.pt at step 7 (--resume)]")
    assert "\t[starts over, the earlier attempt moved aside: no checkpoint of this spec (--resume)]" in lines[2]
    assert lines[3].endswith("\t[new]")
    assert lines[-1] == (f"The real run would keep 1 completed, resume 1 in their folders, start 1 over, write 1 new "
                         f"in {out / 't'}; 1 earlier folders would be moved aside to {out / 't'}/.earlier/<date>/.")
    # A completed run whose stored spec is not the one asked for now is not kept: it runs again.
    asked = specs[completed.name]
    changed = asked.model_copy(update={"params": asked.params.model_copy(update={"lr": 0.3})})
    (completed / "spec.json").write_text(json.dumps(changed.model_dump(mode="json")))
    assert main(["run", str(path), "--out", str(out), "--dry-run", "--resume"]) == 0
    assert _lines(capsys)[0].endswith("\t[completed earlier with another spec (params.lr 0.3 -> 0.1): runs again, "
                                      "the earlier results moved aside (--resume)]")


def test_by_seed_runs_the_first_seed_of_every_run_first(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    default = [line.split("\t")[0] for line in _lines(capsys) if "\tparams:" in line]
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--dry-run", "--by-seed"]) == 0
    by_seed = [line.split("\t")[0] for line in _lines(capsys) if "\tparams:" in line]
    assert sorted(default) == sorted(by_seed) and len(by_seed) == 4
    assert [i[-2:] for i in by_seed] == ["s0", "s0", "s1", "s1"] != [i[-2:] for i in default]
