"""A results folder on a full disk: the run fails with one clear line, nothing half-written is left or taken as
complete, and the suite goes on (root only: the test mounts a 256 KiB tmpfs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting needs root")]


def test_a_full_disk_fails_the_runs_cleanly(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        suite = tmp_path / "s.toml"
        suite.write_text('name = "s"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                         "checkpoint_every_steps = 20\n[budget]\nmax_epochs = 2\neval_every_epochs = 0.5\n"
                         '[defaults]\nbatch_size = 8\n[[run]]\nmethod = "ddp"\nworld_size = 2\n'
                         '[[run]]\nmethod = "sgd"\n')
        done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(mount),
                               "--quiet"], env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        assert "No space left on device" in done.stdout
        assert "0/2 runs completed" in done.stdout
        left = [p.name for p in mount.rglob(".*.tmp")]
        assert left == [], left
        for status in mount.glob("s/*/status.json"):
            assert json.loads(status.read_text())["state"] != "completed"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
