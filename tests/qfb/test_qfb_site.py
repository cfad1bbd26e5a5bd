"""The Q-FB site example for Tianhe-2: each rank gets the cores of both its lanes (the batch script, golden file)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.launch.sites import load_site
from harness.launch.slurm import SiteExecutor, executor_parameters
from harness.suite.expand import expand_suite

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parents[1] / "golden" / "sbatch_tianhe_qfb.sh"
SUITE = """name = "qfb-tianhe"
workload = "digits-cnn"
seeds = [0]
threads_per_rank = 12
nodes = 1
[budget]
max_steps = 10
[[run]]
method = "qfb"
world_size = 2
params = { microbatches = 4 }
"""


def test_the_qfb_site_gives_each_rank_both_lanes_cores(tmp_path):
    path = tmp_path / "qfb-tianhe.toml"
    path.write_text(SUITE)
    site = load_site(ROOT / "sites" / "tianhe-qfb.toml")
    spec = expand_suite(path)[0]
    executor = SiteExecutor("/shared/results/qfb-tianhe/slurm/20260101T000000-abcdef", site.commands,
                            python="python3", check=False)
    executor.update_parameters(**executor_parameters(spec, site))
    text = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    if os.environ.get("DTBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert "#SBATCH --cpus-per-task=12" in text and "#SBATCH --ntasks-per-socket=1" in text
    assert spec.threads_per_rank == site.cpus_per_task  # lane_threads = 12 / 2 = 6 on each lane
    assert "\nyhrun --unbuffered" in text
