"""Validation checks stages and chunks against the workload's blocks: `dtbench run` (and --dry-run) exits 2 with one
line naming the suite file and the field, and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main

#: (method, world_size, params, workload, the field named). digits-mlp has 3 blocks (6 layers in apapo's layer
#: graph), digits-resnet of depth 8 has 5 blocks, synthetic-mlp of depth 0 one.
BAD = [
    ("gpipe", 5, {}, "digits-mlp", "run[0].world_size"),
    ("1f1b", 4, {}, "digits-mlp", "run[0].world_size"),
    ("pipedream", 5, {}, "digits-mlp", "run[0].world_size"),
    ("pb", 4, {}, "digits-mlp", "run[0].world_size"),
    ("qfb", 4, {}, "digits-mlp", "run[0].world_size"),
    ("gpipe", 1, {"stages": 4}, "digits-mlp", "run[0].params.stages"),
    ("1f1b", 4, {"replicas": [1, 1, 1, 1]}, "digits-mlp", "run[0].params.replicas"),
    ("gpipe", 1, {"replicas": [2, 1, 1, 1]}, "digits-mlp", "run[0].params.replicas"),
    ("gpipe", 2, {"partition": [3]}, "digits-mlp", "run[0].params.partition"),
    ("interleaved-1f1b", 2, {}, "digits-mlp", "run[0].world_size"),  # 2 ranks x 2 stages each
    ("interleaved-1f1b", 1, {"stages": 4}, "digits-mlp", "run[0].params.stages"),
    ("interleaved-1f1b", 1, {"stages_per_rank": 2}, "digits-mlp", "run[0].params.stages_per_rank"),
    ("apapo", 7, {"replicate": False}, "digits-mlp", "run[0].world_size"),
    ("apapo", 1, {"stages": 7, "partition": "uniform"}, "digits-mlp", "run[0].params.stages"),
    ("apapo", 1, {"partition": [7]}, "digits-mlp", "run[0].params.partition"),
    ("local", 5, {}, "digits-mlp", "run[0].world_size"),
    ("local", 1, {"chunks": 4}, "digits-mlp", "run[0].params.chunks"),
    ("local", 1, {"chunks": 4, "variant": "overlapping"}, "digits-mlp", "run[0].params.chunks"),
    ("local", 4, {"variant": "greedy"}, "digits-mlp", "run[0].world_size"),
    ("gpipe", 6, {}, "digits-resnet", "run[0].world_size"),
    ("pipedream", 1, {}, "synthetic-mlp", "run[0].params.stages"),  # the virtual mode's 2 stages, on 1 block
]
#: At the limit: as many stages or chunks as blocks (layers for apapo), or a plan that replicates.
GOOD = [
    ("gpipe", 3, {}, "digits-mlp"), ("interleaved-1f1b", 1, {"stages": 2, "stages_per_rank": 2}, "digits-mlp"),
    ("apapo", 7, {}, "digits-mlp"), ("apapo", 1, {"stages": 6, "partition": "uniform"}, "digits-mlp"),
    ("local", 3, {"variant": "greedy"}, "digits-mlp"), ("gpipe", 2, {"partition": [2]}, "digits-mlp"),
    ("pipedream", 1, {"replicas": [2, 3]}, "digits-mlp"), ("local", 5, {}, "digits-resnet"),
]


def _toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def _suite(tmp_path: Path, method: str, world_size: int, params: dict, workload: str, defaults: dict | None = None
           ) -> Path:
    options = {"digits-resnet": "workload_options = { depth = 8 }\n",
               "synthetic-mlp": "workload_options = { depth = 0, num_train = 64, num_test = 32 }\n"}.get(workload, "")
    table = ", ".join(f"{k} = {_toml(v)}" for k, v in params.items())
    lines = [f'name = "stages"\nworkload = "{workload}"\n{options}budget = {{ max_steps = 2 }}\n']
    if defaults:
        lines.append("[defaults]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in defaults.items()))
    lines.append(f'[[run]]\nmethod = "{method}"\nworld_size = {world_size}\nparams = {{ {table} }}\n')
    path = tmp_path / "suite.toml"
    path.write_text("\n".join(lines))
    return path


def _refused(capsys, tmp_path, suite, field, *extra):
    out = tmp_path / "out"
    assert main(["run", str(suite), "--out", str(out), "--quiet", *extra]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and f"{suite}: {field}: " in lines[0], captured.err
    assert not out.exists() or not any(out.iterdir())
    return lines[0]


@pytest.mark.parametrize("method,world_size,params,workload,field", BAD)
def test_too_many_stages_or_chunks_are_refused(capsys, tmp_path, method, world_size, params, workload, field):
    suite = _suite(tmp_path, method, world_size, params, workload)
    line = _refused(capsys, tmp_path, suite, field, "--dry-run")
    assert line.endswith(f"(workload '{workload}')")


def test_a_real_run_is_refused_before_anything_is_written(capsys, tmp_path):
    _refused(capsys, tmp_path, _suite(tmp_path, "local", 1, {"chunks": 4}, "digits-mlp"), "run[0].params.chunks")


def test_the_field_is_the_defaults_key_when_the_count_comes_from_there(capsys, tmp_path):
    suite = _suite(tmp_path, "gpipe", 1, {}, "digits-mlp", defaults={"stages": 4})
    _refused(capsys, tmp_path, suite, "defaults.stages", "--dry-run")


def test_workload_options_that_make_no_model_are_refused(capsys, tmp_path):
    suite = _suite(tmp_path, "gpipe", 1, {}, "digits-resnet")
    suite.write_text(suite.read_text().replace("depth = 8", "depth = 9"))
    line = _refused(capsys, tmp_path, suite, "workload_options", "--dry-run")
    assert "6n+2" in line


@pytest.mark.parametrize("method,world_size,params,workload", GOOD)
def test_as_many_stages_as_blocks_pass(capsys, tmp_path, method, world_size, params, workload):
    suite = _suite(tmp_path, method, world_size, params, workload)
    assert main(["run", str(suite), "--out", str(tmp_path / "out"), "--dry-run"]) == 0, capsys.readouterr().err


def test_the_cli_process_exits_2_with_one_line(tmp_path, dtbench_here):
    """The report's case: gpipe on 5 ranks on digits-mlp (3 blocks) used to fail 25 s into the run, results written.
    The command as a process, then its --dry-run (the same validation) in this one."""
    suite = _suite(tmp_path, "gpipe", 5, {}, "digits-mlp")
    out = tmp_path / "out"
    for extra in ([], ["--dry-run"]):
        if extra:
            done = dtbench_here("run", suite, "--out", out, *extra)
        else:
            done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(out)],
                                  capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and f"{suite}: run[0].world_size: 5 stages" in done.stderr
        assert not out.exists()
