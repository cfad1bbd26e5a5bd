"""The SLURM launcher without a cluster: the batch script (golden file), site files, submission and status through
fake scheduler commands with Tianhe's names."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch.jobs import combine, parse_sacct, suite_states
from harness.launch.sites import load_site
from harness.launch.slurm import SiteExecutor, executor_parameters
from harness.launch.suite import submit_specs
from harness.suite.expand import expand_suite
from harness.suite.files import FileError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parents[1] / "golden" / "sbatch_tianhe_array.sh"
SUITE = """name = "demo"
workload = "digits-mlp"
seeds = [0, 1, 2]
threads_per_rank = 2
nodes = 2
[budget]
max_steps = 10
[[run]]
method = "ddp"
world_size = 4
"""


@pytest.fixture
def suite_file(tmp_path: Path) -> Path:
    path = tmp_path / "demo.toml"
    path.write_text(SUITE)
    return path


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_tianhe(tmp_path: Path, monkeypatch) -> Path:
    """yh* commands in a temp PATH: yhbatch logs its argument and answers like sbatch; the others print what the
    files next to them hold."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "yhbatch", f'echo "$@" >> {bin_dir}/yhbatch.calls\necho "Submitted batch job 42"')
    _script(bin_dir / "yhrun", "exit 0")
    _script(bin_dir / "yhqueue", f"cat {bin_dir}/queue 2>/dev/null; exit 0")
    _script(bin_dir / "yhacct", f"cat {bin_dir}/acct 2>/dev/null; exit 0")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_the_array_batch_script_matches_the_golden_file(suite_file):
    site = load_site(ROOT / "sites" / "tianhe.toml")
    spec = expand_suite(suite_file)[0]
    executor = SiteExecutor("/shared/results/demo/slurm/20260101T000000-abcdef", site.commands, python="python3",
                            check=False)
    executor.update_parameters(**executor_parameters(spec, site))
    executor.parameters["map_count"] = 3
    text = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    if os.environ.get("DTBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert "\nyhrun --unbuffered" in text and "#SBATCH --array=0-2%3" in text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=2" in text


def test_site_files_are_validated_with_one_line_naming_the_field(tmp_path):
    bad = tmp_path / "site.toml"
    bad.write_text('partition = "x"\n[commands]\nsbtach = "yhbatch"\n')
    with pytest.raises(FileError, match=r"site.toml: commands.sbtach: unknown key"):
        load_site(bad)
    bad.write_text("time_min = 0\n")
    with pytest.raises(FileError, match=r"site.toml: time_min: "):
        load_site(bad)
    assert load_site(ROOT / "sites" / "local.toml").partition == "debug"


def test_a_bad_site_or_nodes_flag_exits_2_and_writes_nothing(tmp_path, suite_file, capsys):
    bad = tmp_path / "site.toml"
    bad.write_text("colour = 1\n")
    out = tmp_path / "out"
    assert main(["run", str(suite_file), "--launcher", "slurm", "--site", str(bad), "--out", str(out)]) == 2
    assert main(["run", str(suite_file), "--launcher", "slurm", "--nodes", "3", "--out", str(out)]) == 2
    assert "does not divide the world size" in capsys.readouterr().err
    assert not out.exists()


def test_nodes_must_divide_the_world_size(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SUITE.replace("nodes = 2", "nodes = 3"))
    with pytest.raises(FileError, match=r"s.toml: nodes: 3 nodes do not divide world_size 4 \(run run\[0\]\)$"):
        expand_suite(path)


def test_a_suite_goes_out_as_one_array_through_the_site_commands(tmp_path, suite_file, fake_tianhe, capsys):
    out = tmp_path / "out"
    code = main(["run", str(suite_file), "--launcher", "slurm", "--site", str(ROOT / "sites" / "tianhe.toml"),
                 "--out", str(out)])
    assert code == 0
    calls = (fake_tianhe / "yhbatch.calls").read_text().splitlines()
    assert len(calls) == 1  # one array for the three runs
    script = Path(calls[0]).read_text()
    assert "#SBATCH --array=0-2%3" in script and "\nyhrun " in script and "module load anaconda3" in script
    printed = capsys.readouterr().out
    suite_dir = out / "demo"
    for seed in range(3):
        run_dir = suite_dir / f"ddp-digits-mlp-w4-s{seed}"
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "pending" and status["slurm_job_id"] == f"42_{seed}"
        assert f"ddp-digits-mlp-w4-s{seed}\tjob 42_{seed}" in printed
    jobs = json.loads((suite_dir / "slurm" / "jobs.json").read_text())
    assert jobs["commands"]["squeue"] == "yhqueue" and jobs["runs"]["ddp-digits-mlp-w4-s1"]["job_id"] == "42_1"

    # The scheduler's view, through yhqueue and yhacct: live jobs from the queue, ended ones from accounting.
    (fake_tianhe / "queue").write_text("42_0|RUNNING\n42_1|PENDING\n")
    (fake_tianhe / "acct").write_text("42_2|CANCELLED by 0\n")
    states = {row.run_id[-2:]: row.state for row in suite_states(suite_dir)}
    assert states == {"s0": "running", "s1": "pending", "s2": "failed"}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "harness.cli", "wait", str(suite_dir), "--poll", "0.1",
                           "--timeout", "1"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 3 and "running" in done.stdout
    (fake_tianhe / "queue").write_text("")
    (fake_tianhe / "acct").write_text("42_[0-1]|COMPLETED\n42_2|CANCELLED by 0\n")
    for seed in range(2):
        run_dir = suite_dir / f"ddp-digits-mlp-w4-s{seed}"
        (run_dir / "status.json").write_text(json.dumps({"state": "completed", "final": {"steps": 10}}))
    done = subprocess.run([sys.executable, "-m", "harness.cli", "wait", str(suite_dir), "--poll", "0.1"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2/3 runs completed" in done.stdout and "the job ended CANCELLED" in done.stdout
    status = subprocess.run([sys.executable, "-m", "harness.cli", "status", str(suite_dir)], capture_output=True,
                            text=True, env=env, timeout=60)
    assert status.returncode == 0 and "completed" in status.stdout


def test_sacct_output_is_parsed_with_arrays_expanded():
    text = "12_[0-2]|PENDING\n13|RUNNING\n13.batch|RUNNING\n14_1|CANCELLED by 0\n"
    assert parse_sacct(text) == {"12_0": "PENDING", "12_1": "PENDING", "12_2": "PENDING", "13": "RUNNING",
                                 "14_1": "CANCELLED"}


@pytest.mark.parametrize(("status", "job", "expected"), [
    ({"state": "pending"}, "PENDING", "pending"),
    ({"state": "preempted"}, "PENDING", "requeued"),
    ({"state": "preempted"}, "REQUEUED", "requeued"),
    ({"state": "running"}, "RUNNING", "running"),
    ({"state": "running"}, "FAILED", "failed"),
    ({"state": "preempted"}, "CANCELLED", "preempted"),
    ({"state": "completed"}, "COMPLETED", "completed"),
    ({"state": "failed", "error": {"message": "rank 1: boom"}}, "FAILED", "failed"),
    ({"state": "running"}, None, "running"),
])
def test_run_states_join_status_json_and_the_scheduler(status, job, expected):
    assert combine(status, job)[0] == expected


def test_submit_skips_completed_runs_on_resume(tmp_path, suite_file, fake_tianhe):
    specs = expand_suite(suite_file)
    site = load_site(ROOT / "sites" / "tianhe.toml")
    done, changed = (tmp_path / "out" / "demo" / spec.run_id for spec in specs[:2])
    for run_dir, spec in ((done, specs[0]), (changed, specs[1])):
        run_dir.mkdir(parents=True)
        (run_dir / "status.json").write_text(json.dumps({"state": "completed"}))
        (run_dir / "spec.json").write_text(spec.model_dump_json())
    other = specs[1].model_copy(update={"params": specs[1].params.model_copy(update={"lr": 0.123})})
    (changed / "spec.json").write_text(other.model_dump_json())  # completed under another spec: submitted again
    submitted = submit_specs(specs, tmp_path / "out", site, resume=True)
    assert [s.spec.run_id for s in submitted] == [s.run_id for s in specs[1:]]
    (earlier,) = (tmp_path / "out" / "demo" / ".earlier").iterdir()
    assert json.loads((earlier / changed.name / "spec.json").read_text())["params"]["lr"] == 0.123


def test_network_emulation_is_refused_for_slurm(tmp_path, capsys):
    from harness import cli

    suite = tmp_path / "net.toml"
    suite.write_text('name = "net"\nworkload = "digits-mlp"\n[network]\nrate = "100mbit"\n'
                     '[[run]]\nmethod = "ddp"\nworld_size = 2\n')
    assert cli.main(["run", str(suite), "--launcher", "slurm", "--out", str(tmp_path / "out")]) == 2
    assert "local launcher only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
