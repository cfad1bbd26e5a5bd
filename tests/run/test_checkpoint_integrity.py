"""Checkpoint integrity: sha256 and spec-hash sidecars, the last two checkpoints kept, a kill -9 mid-write leaving a
valid one, and --resume falling back past a damaged checkpoint (or starting over) and saying so."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from test_checkpoint import STEPS as LONG
from test_checkpoint import _check_same_as, _equal, _spec, _stop_when

from harness.cli import main
from harness.launch.local import launch
from harness.launch.suite import prepare_run_dir
from harness.results import read_jsonl
from harness.run import checkpoint
from harness.run import checkpoint_files as files

SPEC = '{"run_id": "a"}'  # choose() hashes the spec text, and (load=True) checks the checkpoint's own "spec"
HASH = files.spec_hash(SPEC)


def _state(step: int, spec: str = SPEC) -> dict:
    return {"format": checkpoint.FORMAT_VERSION, "spec": spec, "step": step, "metrics_bytes": 100 * step,
            "ranks": [{"w": torch.full((4096,), float(step))}]}


def _written(run_dir: Path, *steps: int) -> Path:
    run_dir.mkdir(exist_ok=True)
    for step in steps:
        files.write(run_dir, _state(step), HASH)
    return run_dir


def zero_middle(path: Path, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(n)
    path.write_bytes(bytes(data))


def truncate_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def test_write_keeps_the_last_two_checkpoints_each_verified_and_weights_only_loadable(tmp_path):
    run_dir = _written(tmp_path / "r", 10, 20, 30)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoint.prev.pt", "checkpoint.prev.pt.json", "checkpoint.pt", "checkpoint.pt.json"]
    for name, step in ((files.CURRENT, 30), (files.PREVIOUS, 20)):
        assert torch.load(run_dir / name, weights_only=True)["step"] == step
        meta = json.loads(files.sidecar(run_dir / name).read_text())
        assert meta["sha256"] == files.file_sha256(run_dir / name) and meta["spec_sha256"] == HASH
        assert meta["step"] == step and meta["bytes"] == (run_dir / name).stat().st_size
    choice = files.choose(run_dir, HASH, load=True)
    assert (choice.file, choice.step, choice.rejected) == (files.CURRENT, 30, [])
    assert choice.saved["metrics_bytes"] == 3000
    assert choice.describe() == "resuming from its checkpoint.pt at step 30"


@pytest.mark.parametrize(("damage", "reason"), [
    (zero_middle, "sha256 mismatch"),
    (truncate_half, "truncated: "),
    (lambda p: files.sidecar(p).unlink(), "no sidecar checkpoint.pt.json"),
    (lambda p: files.sidecar(p).write_text("{not json"), "unreadable sidecar checkpoint.pt.json"),
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, reason):
    run_dir = _written(tmp_path / "r", 10, 20)
    damage(run_dir / files.CURRENT)
    for load in (False, True):  # the suite's check (streamed) and rank 0's (the bytes it then loads)
        choice = files.choose(run_dir, HASH, load=load)
        assert (choice.file, choice.step) == (files.PREVIOUS, 10)
        assert [r["file"] for r in choice.rejected] == [files.CURRENT]
        assert choice.rejected[0]["reason"].startswith(reason), choice.rejected
    assert choice.saved["metrics_bytes"] == 1000  # metrics.jsonl is cut back to the older checkpoint's size
    assert torch.equal(choice.saved["ranks"][0]["w"], torch.full((4096,), 10.0))
    assert choice.describe().startswith(f"rejected checkpoint.pt: {reason}")
    assert choice.describe().endswith("resuming from checkpoint.prev.pt at step 10")


def test_a_checkpoint_of_another_spec_is_rejected(tmp_path):
    run_dir = _written(tmp_path / "r", 10, 20)
    choice = files.choose(run_dir, files.spec_hash('{"run_id": "b"}'), load=True)
    assert choice.file is None and choice.saved is None
    assert [r["reason"].split(":")[0] for r in choice.rejected] == ["spec hash mismatch"] * 2


def test_a_sidecar_that_lies_about_the_spec_is_caught_when_loading(tmp_path):
    """A .pt whose own `spec` is another run's, under a sidecar claiming this spec: rank 0's load rejects it."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    files.write(run_dir, _state(10, spec='{"run_id": "b"}'), HASH)
    assert files.choose(run_dir, HASH).file == files.CURRENT  # sha256 and sidecar alone cannot tell
    choice = files.choose(run_dir, HASH, load=True)
    assert choice.file is None and "disagree with its sidecar" in choice.rejected[0]["reason"]


def test_both_damaged_means_a_restart_from_scratch_that_says_why(tmp_path):
    run_dir = _written(tmp_path / "r", 10, 20)
    zero_middle(run_dir / files.CURRENT)
    truncate_half(run_dir / files.PREVIOUS)
    choice = files.choose(run_dir, HASH, load=True)
    assert (choice.file, choice.step, choice.saved) == (None, 0, None) and choice.found_files
    assert choice.record() == {"from": None, "step": 0, "rejected": [
        {"file": "checkpoint.pt", "reason": "sha256 mismatch"},
        {"file": "checkpoint.prev.pt", "reason": choice.rejected[1]["reason"]}]}
    assert choice.rejected[1]["reason"].startswith("truncated")
    assert choice.describe().startswith("no valid checkpoint (checkpoint.pt: sha256 mismatch; checkpoint.prev.pt: "
                                        "truncated")
    assert choice.describe().endswith("restarting from step 0")


def test_no_checkpoint_files_is_a_first_start_not_a_rejection(tmp_path):
    choice = files.choose(tmp_path, HASH, load=True)
    assert choice.file is None and not choice.found_files and not files.present(tmp_path)


def test_quarantine_keeps_a_damaged_file_from_being_rotated_over_the_good_one(tmp_path):
    run_dir = _written(tmp_path / "r", 10, 20)
    zero_middle(run_dir / files.CURRENT)
    (run_dir / ".checkpoint.pt.999.tmp").write_bytes(b"half a write")
    files.quarantine(run_dir, files.choose(run_dir, HASH))
    assert (run_dir / "checkpoint.pt.rejected").exists() and (run_dir / "checkpoint.pt.json.rejected").exists()
    assert not (run_dir / ".checkpoint.pt.999.tmp").exists()
    files.write(run_dir, _state(30), HASH)  # the resumed run's next checkpoint: no rotation of the damaged one
    assert files.choose(run_dir, HASH).record() == {"from": "checkpoint.pt", "step": 30, "rejected": []}
    (run_dir / files.CURRENT).unlink()
    assert files.choose(run_dir, HASH, load=True).saved["step"] == 10  # the good one is still there, valid


def test_a_valid_checkpoint_exists_at_every_instant_of_a_write(tmp_path, monkeypatch):
    """Every change a write makes on disk is an os.replace: before and after each, a kill -9 would leave the old
    or the new checkpoint valid (from the second write on, when there is one to keep)."""
    run_dir = _written(tmp_path / "r", 10)
    real_replace = os.replace
    seen: list[int] = []

    def check(allowed: set[int]) -> None:
        choice = files.choose(run_dir, HASH, load=True)
        assert choice.file is not None and choice.step in allowed, choice.record()
        seen.append(choice.step)

    def replace(src, dst):
        check(allowed)
        real_replace(src, dst)
        check(allowed)

    monkeypatch.setattr(files.os, "replace", replace)
    for old, new in ((10, 20), (20, 30), (30, 40)):
        allowed = {old, new}
        files.write(run_dir, _state(new), HASH)
    monkeypatch.undo()
    assert len(seen) >= 3 * 6 and set(seen) == {10, 20, 30, 40}
    assert files.choose(run_dir, HASH).step == 40 and files.choose(run_dir, HASH).rejected == []


WRITER = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from harness.run import checkpoint_files as files
    run_dir, spec = Path(sys.argv[1]), sys.argv[2]
    step = 0
    while True:
        step += 1
        files.write(run_dir, {"format": 1, "spec": spec, "step": step, "metrics_bytes": step,
                              "ranks": [{"w": torch.full((1 << 19,), float(step))}]}, files.spec_hash(spec))
        print(step, flush=True)
""")


@pytest.mark.slow
def test_a_kill_9_during_checkpoint_writes_leaves_a_valid_checkpoint(tmp_path):
    """A process writing 2 MiB checkpoints back to back is SIGKILLed at arbitrary moments (mostly mid-write)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    for attempt, delay in enumerate((0.0, 0.013, 0.029)):
        run_dir = tmp_path / f"r{attempt}"
        run_dir.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), SPEC], stdout=subprocess.PIPE,
                                text=True, env=env)
        while int(proc.stdout.readline() or 0) < 3:  # two good checkpoints, and a write under way
            assert proc.poll() is None, "the writer died"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        choice = files.choose(run_dir, HASH, load=True)
        assert choice.file is not None and choice.step >= 2, choice.record()
        assert torch.equal(choice.saved["ranks"][0]["w"], torch.full((1 << 19,), float(choice.step)))


# -- end to end through the CLI ---------------------------------------------------------------------------------
STEPS, EVERY = 40, 10


def _suite(tmp_path: Path) -> Path:
    path = tmp_path / "ci.toml"
    path.write_text(f'name = "ci"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                    f"checkpoint_every_steps = {EVERY}\n[budget]\nmax_steps = {STEPS}\nmax_epochs = 1000\n"
                    f'eval_every_epochs = 0.5\n[defaults]\nmomentum = 0.9\n[[run]]\nmethod = "ddp"\nworld_size = 2\n')
    return path


def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in (out / "ci").iterdir() if p.is_dir()]
    return run_dir


def _job_died(run_dir: Path) -> None:
    """What a job killed after its last checkpoint (node failure, kill -9) leaves in status.json."""
    status = json.loads((run_dir / "status.json").read_text())
    (run_dir / "status.json").write_text(json.dumps({**status, "state": "failed"}))


def _methods(run_dir: Path) -> list:
    saved = checkpoint.load(run_dir / files.CURRENT)
    assert saved["step"] == STEPS
    return [rank["method"] for rank in saved["ranks"]]


def _curve(run_dir: Path) -> list:
    records = read_jsonl(run_dir / "metrics.jsonl")
    return sorted((r["kind"], r["rank"], r["step"], r.get("loss"), r.get("test_loss")) for r in records
                  if r["kind"] in ("train", "eval"))


def _same_as(reference: Path, run_dir: Path) -> None:
    _equal(_methods(reference), _methods(run_dir), "method")  # model and optimizer state, bitwise
    assert _curve(run_dir) == _curve(reference)  # every step once, with the same losses and evaluations


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("reference")
    assert main(["run", str(_suite(tmp)), "--out", str(tmp / "out"), "--quiet"]) == 0
    return _run_dir(tmp / "out")


def _resume(suite: Path, out: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["run", str(suite), "--out", str(out), "--resume", "--quiet"]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_resume_past_a_corrupt_checkpoint_uses_the_previous_one_and_ends_as_an_uninterrupted_run(
        tmp_path, reference, capsys):
    suite, out = _suite(tmp_path), tmp_path / "out"
    assert main(["run", str(suite), "--out", str(out), "--quiet"]) == 0
    run_dir = _run_dir(out)
    assert checkpoint.load(run_dir / files.PREVIOUS)["step"] == STEPS - EVERY
    _job_died(run_dir)
    zero_middle(run_dir / files.CURRENT)

    console = _resume(suite, out, capsys)
    _same_as(reference, run_dir)
    said = f"rejected checkpoint.pt: sha256 mismatch; resuming from checkpoint.prev.pt at step {STEPS - EVERY}"
    assert re.search(rf"{run_dir.name}: completed in [0-9.]+ s \({re.escape(said)}\)$", console, re.MULTILINE)
    assert f"dtbench: --resume: {said}" in (run_dir / "logs" / "rank0.log").read_text()
    assert "dtbench: --resume: from checkpoint.prev.pt" in (run_dir / "logs" / "rank1.log").read_text()
    record = {"from": "checkpoint.prev.pt", "step": STEPS - EVERY,
              "rejected": [{"file": "checkpoint.pt", "reason": "sha256 mismatch"}]}
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["resume"] == record
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["resume"] == record and manifest["resumed_from_step"] == STEPS - EVERY
    assert (run_dir / "checkpoint.pt.rejected").exists()
    assert files.choose(run_dir, json.loads((run_dir / files.sidecar(run_dir / files.CURRENT)).read_text())
                        ["spec_sha256"]).rejected == []  # the run's new checkpoints verify


@pytest.mark.slow
def test_the_console_names_the_checkpoint_rank_0_loaded_not_the_launchers_choice(tmp_path, reference, capsys):
    """A checkpoint.pt whose sidecar was rewritten to match bytes that are no checkpoint: the launcher, which checks
    size and sha256 only, would pick it; rank 0 loads it, rejects it and falls back. The console says what rank 0
    did (before: 'resuming from its checkpoint.pt at step 40', the launcher's choice)."""
    suite, out = _suite(tmp_path), tmp_path / "out"
    assert main(["run", str(suite), "--out", str(out), "--quiet"]) == 0
    run_dir = _run_dir(out)
    _job_died(run_dir)
    current = run_dir / files.CURRENT
    current.write_bytes(b"not a checkpoint, but its sidecar says it is")
    meta = json.loads(files.sidecar(current).read_text())
    meta.update(sha256=files.file_sha256(current), bytes=current.stat().st_size)
    files.sidecar(current).write_text(json.dumps(meta))
    assert files.choose(run_dir, meta["spec_sha256"]).file == files.CURRENT  # the launcher's unloaded choice

    console = _resume(suite, out, capsys)
    _same_as(reference, run_dir)
    (line,) = [line for line in console.splitlines() if f"{run_dir.name}: completed in" in line]
    assert "rejected checkpoint.pt: does not load" in line
    assert line.endswith(f"resuming from checkpoint.prev.pt at step {STEPS - EVERY})")


@pytest.mark.slow
def test_resume_with_every_checkpoint_damaged_restarts_from_scratch_and_says_so(tmp_path, reference, capsys):
    suite, out = _suite(tmp_path), tmp_path / "out"
    assert main(["run", str(suite), "--out", str(out), "--quiet"]) == 0
    run_dir = _run_dir(out)
    _job_died(run_dir)
    truncate_half(run_dir / files.CURRENT)
    zero_middle(run_dir / files.PREVIOUS)

    console = _resume(suite, out, capsys)
    _same_as(reference, run_dir)
    assert "no valid checkpoint (checkpoint.pt: truncated: " in console
    assert "checkpoint.prev.pt: sha256 mismatch); restarting from step 0)" in console
    assert "restarting from step 0" in (run_dir / "logs" / "rank0.log").read_text()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["resume"]["from"] is None and status["resume"]["step"] == 0
    assert [r["file"] for r in status["resume"]["rejected"]] == ["checkpoint.pt", "checkpoint.prev.pt"]
    assert "resumed_from_step" not in json.loads((run_dir / "manifest.json").read_text())


@pytest.mark.slow
def test_a_run_stopped_mid_way_resumes_past_its_corrupt_checkpoint_bitwise(tmp_path, capsys):
    """The same through a real interruption: a 600-step ddp run stopped by SIGUSR2 after epoch 2 (a checkpoint at
    the stop, the periodic one before it kept), the newest corrupted, then `dtbench run --resume`."""
    spec = _spec(tmp_path, "ddp", 2)
    reference_dir = prepare_run_dir(spec, tmp_path / "reference")
    assert launch(spec, reference_dir).state == "completed"
    run_dir = prepare_run_dir(spec, tmp_path / "stopped")
    assert launch(spec, run_dir, _stop_when(run_dir, 2.0, signal.SIGUSR2, 1)).state == "preempted"
    stopped_at = checkpoint.load(run_dir / files.CURRENT)["step"]
    previous = checkpoint.load(run_dir / files.PREVIOUS)["step"]
    assert 0 < previous < stopped_at < LONG and previous % 25 == 0
    zero_middle(run_dir / files.CURRENT)

    console = _resume(tmp_path / "ck.toml", tmp_path / "stopped", capsys)
    assert f"rejected checkpoint.pt: sha256 mismatch; resuming from checkpoint.prev.pt at step {previous}" in console
    assert json.loads((run_dir / "status.json").read_text())["resume"]["from"] == "checkpoint.prev.pt"
    _check_same_as(reference_dir, run_dir, 2)


def test_a_sidecar_with_mistyped_fields_is_rejected_not_a_crash(tmp_path):
    import json as _json

    from harness.run import checkpoint_files

    state = {"format": 1, "step": 3, "metrics_bytes": 0, "ranks": []}
    checkpoint_files.write(tmp_path, state, "s" * 64)
    side = checkpoint_files.sidecar(tmp_path / checkpoint_files.CURRENT)
    meta = _json.loads(side.read_text())
    meta["bytes"] = None
    side.write_text(_json.dumps(meta))
    choice = checkpoint_files.choose(tmp_path, "s" * 64)
    assert choice.file is None and "mistyped" in choice.rejected[0]["reason"]
