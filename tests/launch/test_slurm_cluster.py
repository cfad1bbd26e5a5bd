"""On a real local SLURM cluster (nox -s slurm): multi-node runs, one array per suite, requeue with exact resume,
failures, and Tianhe's command names through shims."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.launch.local import launch
from harness.launch.sites import Commands
from harness.launch.slurm import job_class
from harness.launch.suite import prepare_run_dir
from harness.results import read_jsonl
from harness.run import checkpoint
from harness.suite.expand import expand_suite

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "sites" / "local.toml"
WAIT_S = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from slurm_cluster import LocalSlurm, missing_binaries

    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root")
    missing = missing_binaries()
    if missing:
        pytest.skip(f"SLURM packages missing ({', '.join(missing)}): run nox -s slurm")
    slurm = LocalSlurm(Path(tmp_path_factory.mktemp("slurm")))
    slurm.start()
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = slurm.env["SLURM_CONF"]
    try:
        yield slurm
    finally:
        slurm.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


def env(extra_path: Path | None = None) -> dict[str, str]:
    """The environment of dtbench commands (and so of the jobs they submit: sbatch exports it)."""
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    out = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    if extra_path is not None:
        out["PATH"] = f"{extra_path}{os.pathsep}{out['PATH']}"
    return out


def dtbench(*args: str, extra_path: Path | None = None, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], env=env(extra_path), capture_output=True,
                          text=True, timeout=timeout)


def write_suite(tmp_path: Path, name: str, body: str, steps: int = 40, seeds: str = "[0]", top: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nworkload = "digits-mlp"\nseeds = {seeds}\nthreads_per_rank = 1\n{top}'
                    f"[budget]\nmax_steps = {steps}\nmax_epochs = 1000\neval_every_epochs = 5\n"
                    f"[defaults]\nmomentum = 0.9\n{body}")
    return path


def submitted_ids(stdout: str) -> dict[str, str]:
    return dict(line.split("\tjob ") for line in stdout.splitlines() if "\tjob " in line)


def files(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}


def train_records(run_dir: Path) -> list[tuple]:
    return sorted((r["rank"], r["step"], r["loss"], r["bytes_sent"]) for r in read_jsonl(run_dir / "metrics.jsonl")
                  if r["kind"] == "train")


def test_a_two_node_ddp_run_matches_a_local_run(cluster, tmp_path):
    suite = write_suite(tmp_path, "twonode", '[[run]]\nmethod = "ddp"\nworld_size = 2\nnodes = 2\n')
    out = tmp_path / "out"
    submitted = dtbench("run", str(suite), "--launcher", "slurm", "--site", str(SITE), "--out", str(out))
    assert submitted.returncode == 0, submitted.stderr
    waited = dtbench("wait", str(out / "twonode"), "--poll", "1")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    local = dtbench("run", str(suite), "--out", str(tmp_path / "local"), "--quiet")
    assert local.returncode == 0, local.stderr

    run_id = "ddp-digits-mlp-w2-s0"
    on_slurm, on_host = out / "twonode" / run_id, tmp_path / "local" / "twonode" / run_id
    assert files(on_slurm) == files(on_host) == {"spec.json", "manifest.json", "metrics.jsonl", "status.json",
                                                "logs/rank0.log", "logs/rank1.log"}
    manifest = json.loads((on_slurm / "manifest.json").read_text())
    status = json.loads((on_slurm / "status.json").read_text())
    job_id = submitted_ids(submitted.stdout)[run_id]
    assert manifest["launcher"] == "slurm" and manifest["slurm_job_id"] == status["slurm_job_id"] == job_id
    assert status["state"] == "completed" and status["final"]["steps"] == 40
    # The same seed on CPU: the two ranks on two SLURM nodes train exactly as two local processes do.
    assert train_records(on_slurm) == train_records(on_host)
    nodes = cluster.run("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "NodeList").stdout.split()
    assert nodes == ["n[1-2]"]


def test_a_three_run_suite_goes_out_as_one_array(cluster, tmp_path):
    suite = write_suite(tmp_path, "array", '[[run]]\nmethod = "sgd"\n', steps=20, seeds="[0, 1, 2]")
    out = tmp_path / "out"
    submitted = dtbench("run", str(suite), "--launcher", "slurm", "--site", str(SITE), "--out", str(out))
    assert submitted.returncode == 0, submitted.stderr
    ids = submitted_ids(submitted.stdout)
    arrays = {job.split("_")[0] for job in ids.values()}
    assert len(ids) == 3 and len(arrays) == 1 and sorted(j.split("_")[1] for j in ids.values()) == ["0", "1", "2"]
    waited = dtbench("wait", str(out / "array"), "--poll", "1")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    accounting = cluster.run("sacct", "-n", "-P", "-X", "-j", arrays.pop(), "-o", "JobID,State").stdout.split()
    assert sorted(accounting) == sorted(f"{job}|COMPLETED" for job in ids.values())


def _wait_for_step(run_dir: Path, step: int, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / checkpoint.CHECKPOINT_FILE).exists() and any(
                r["kind"] == "train" and r["step"] >= step for r in read_jsonl(run_dir / "metrics.jsonl")):
            return
        time.sleep(0.2)
    raise AssertionError(f"{run_dir.name} never reached step {step}")


def test_a_requeued_job_resumes_exactly_from_its_checkpoint(cluster, tmp_path):
    steps = 1500
    suite = write_suite(tmp_path, "preempt", '[[run]]\nmethod = "ddp"\nworld_size = 2\nnodes = 2\n', steps=steps,
                        top="checkpoint_every_steps = 50\n")
    out = tmp_path / "out"
    submitted = dtbench("run", str(suite), "--launcher", "slurm", "--site", str(SITE), "--out", str(out))
    assert submitted.returncode == 0, submitted.stderr
    run_id = "ddp-digits-mlp-w2-s0"
    job_id = submitted_ids(submitted.stdout)[run_id]
    run_dir = out / "preempt" / run_id
    _wait_for_step(run_dir, 120)
    # submitit's interrupt helper (time-out form: USR2, as SLURM sends it before the limit), with our commands.
    job_class(Commands())(folder=out / "preempt" / "slurm", job_id=job_id)._interrupt(timeout=True)
    waited = dtbench("wait", str(out / "preempt"), "--poll", "1")
    assert waited.returncode == 0, waited.stdout + waited.stderr + (run_dir / "logs" / "rank0.log").read_text()

    manifest = json.loads((run_dir / "manifest.json").read_text())
    resumed_at = manifest["resumed_from_step"]
    assert 120 <= resumed_at < steps
    restarts = cluster.run("scontrol", "show", "job", job_id, check=False).stdout
    assert "Restarts=1" in restarts, restarts

    # The same run without interruption, on this host: the same final parameters, bit for bit.
    spec = expand_suite(suite)[0]
    reference = prepare_run_dir(spec, tmp_path / "reference")
    assert launch(spec, reference).state == "completed"
    final = checkpoint.load(run_dir / checkpoint.CHECKPOINT_FILE)
    expected = checkpoint.load(reference / checkpoint.CHECKPOINT_FILE)
    assert final["step"] == expected["step"] == steps
    for rank in range(2):
        got, want = final["ranks"][rank]["method"]["model"], expected["ranks"][rank]["method"]["model"]
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    records = train_records(run_dir)
    assert [(r, s) for r, s, _, _ in records] == [(r, s) for r in range(2) for s in range(1, steps + 1)]
    assert records == train_records(reference)


def test_scontrol_requeue_stops_the_ranks_with_sigterm_and_the_run_resumes(cluster, tmp_path):
    """SLURM's own requeue (as on preemption): SIGTERM to every task, a checkpoint, and a restart that resumes."""
    steps = 1500
    suite = write_suite(tmp_path, "requeue", '[[run]]\nmethod = "sgd"\n', steps=steps,
                        top="checkpoint_every_steps = 1000\n")
    out = tmp_path / "out"
    submitted = dtbench("run", str(suite), "--launcher", "slurm", "--site", str(SITE), "--out", str(out))
    assert submitted.returncode == 0, submitted.stderr
    run_id = "sgd-digits-mlp-w1-s0"
    run_dir = out / "requeue" / run_id
    deadline = time.monotonic() + WAIT_S
    while not any(r["kind"] == "train" and r["step"] >= 100 for r in read_jsonl(run_dir / "metrics.jsonl")):
        assert time.monotonic() < deadline, "the run never reached step 100"
        time.sleep(0.2)
    cluster.run("scontrol", "requeue", submitted_ids(submitted.stdout)[run_id])
    waited = dtbench("wait", str(out / "requeue"), "--poll", "1")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    resumed_at = json.loads((run_dir / "manifest.json").read_text())["resumed_from_step"]
    assert 100 <= resumed_at < 1000  # the SIGTERM checkpoint, not a periodic one
    records = train_records(run_dir)
    assert [s for _, s, _, _ in records] == list(range(1, steps + 1))


def test_a_raising_job_ends_failed_and_wait_says_so(cluster, tmp_path):
    suite = write_suite(tmp_path, "broken", '[[run]]\nmethod = "ddp"\nworld_size = 2\nnodes = 2\n')
    text = suite.read_text().replace('workload = "digits-mlp"', 'workload = "cifar10-resnet20"\n'
                                     f'data_root = "{tmp_path / "no-cifar"}"')
    suite.write_text(text.replace("momentum = 0.9\n", "momentum = 0.9\nbatch_size = 32\n"))
    out = tmp_path / "out"
    submitted = dtbench("run", str(suite), "--launcher", "slurm", "--site", str(SITE), "--out", str(out))
    assert submitted.returncode == 0, submitted.stderr
    waited = dtbench("wait", str(out / "broken"), "--poll", "1")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    status = json.loads((out / "broken" / "ddp-cifar10-resnet20-w2-s0" / "status.json").read_text())
    assert status["state"] == "failed" and "FileNotFoundError" in status["error"]["message"]
    assert "failed" in waited.stdout and "FileNotFoundError" in waited.stdout


def _shim(bin_dir: Path, name: str, target: str) -> None:
    """`name` forwards to the cluster's real `target`, logging each call."""
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> {bin_dir}/calls.log\nexec {target} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_tianhe_command_names_drive_the_cluster_through_shims(cluster, tmp_path):
    bin_dir = tmp_path / "yhbin"
    bin_dir.mkdir()
    names = {"yhbatch": "sbatch", "yhrun": "srun", "yhqueue": "squeue", "yhcancel": "scancel", "yhacct": "sacct",
             "yhcontrol": "scontrol"}
    for name, target in names.items():
        _shim(bin_dir, name, target)
    site = tmp_path / "tianhe-local.toml"
    site.write_text('name = "tianhe-local"\npartition = "debug"\ntime_min = 30\ncpus_per_task = 1\n[commands]\n'
                    + "".join(f'{real} = "{name}"\n' for name, real in names.items()))
    suite = write_suite(tmp_path, "yh", '[[run]]\nmethod = "ddp"\nworld_size = 2\nnodes = 2\n', steps=20)
    out = tmp_path / "out"
    submitted = dtbench("run", str(suite), "--launcher", "slurm", "--site", str(site), "--out", str(out),
                        extra_path=bin_dir)
    assert submitted.returncode == 0, submitted.stderr
    waited = dtbench("wait", str(out / "yh"), "--poll", "1", extra_path=bin_dir)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    used = {line.split()[0] for line in (bin_dir / "calls.log").read_text().splitlines()}
    assert {"yhbatch", "yhrun", "yhqueue"} <= used  # submitted, ranks started, and the queue asked
    script = next((out / "yh" / "slurm").rglob("*_submission.sh")).read_text()
    assert "\nyhrun --unbuffered" in script
