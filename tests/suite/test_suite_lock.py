"""One `dtbench run` at a time per suite folder: a second one refuses with one line, exit 2, and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.launch.lock import LOCK_FILE, FolderBusy, suite_lock

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def test_a_second_holder_in_another_process_is_refused_naming_the_first(tmp_path):
    code = ("import sys; from pathlib import Path; from harness.launch.lock import suite_lock, FolderBusy\n"
            "try:\n    with suite_lock(Path(sys.argv[1])): print('got it')\n"
            "except FolderBusy as exc: print(exc)\n")
    with suite_lock(tmp_path / "s"):
        held = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
                              env=ENV, timeout=60)
        assert f"pid {os.getpid()}" in held.stdout and "another dtbench run" in held.stdout
    free = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
                          env=ENV, timeout=60)
    assert free.stdout.strip() == "got it"  # released when its holder let go


def test_the_lock_is_not_reentrant_across_descriptors(tmp_path):
    with suite_lock(tmp_path / "s"), pytest.raises(FolderBusy), suite_lock(tmp_path / "s"):
        pass


def test_dtbench_run_into_a_busy_suite_folder_exits_2_and_writes_nothing(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\nseeds = [0]\n[budget]\nmax_epochs = 1\n'
                     '[[run]]\nmethod = "sgd"\n')
    out = tmp_path / "out"
    with suite_lock(out / "s"):
        done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(out), "--quiet"],
                              capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "another dtbench run" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in (out / "s").iterdir()) == [LOCK_FILE]


def test_an_out_folder_that_cannot_be_made_is_one_line_and_exit_2(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\nseeds = [0]\n[budget]\nmax_epochs = 1\n'
                     '[[run]]\nmethod = "sgd"\n')
    (tmp_path / "out").write_text("a file where the results folder goes")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(tmp_path / "out"),
                           "--quiet"], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "cannot write the results" in done.stderr
