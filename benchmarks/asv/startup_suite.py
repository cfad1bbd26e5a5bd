"""The 1-step suites of the start-up benchmarks: what `dtbench run` costs before and after any training."""

from __future__ import annotations

from pathlib import Path

HEADER = """\
# A 1-step suite: what `dtbench run` costs before and after any training.
name = "startup"
workload = "{workload}"
seeds = {seeds}
threads_per_rank = 1
{options}
[budget]
max_steps = 1

[defaults]
batch_size = 32
"""

SYNTHETIC_OPTIONS = """
[workload_options]
in_features = 32
hidden = 64
depth = 1
num_train = 256
num_test = 64
"""

RUN = """
[[run]]
method = "{method}"
world_size = {world_size}
"""

#: The world size each method of these suites runs at.
WORLD_SIZES = {"sgd": 1, "ddp": 2}


def write_suite(folder: Path, methods: list[str], seeds: int = 1, workload: str = "synthetic-mlp") -> Path:
    """folder/startup.toml: one 1-step run of each method per seed (len(methods) x seeds runs), on a tiny
    synthetic-mlp (32 -> 64 -> 10, 256 samples) or on `workload` with its own data."""
    options = SYNTHETIC_OPTIONS if workload == "synthetic-mlp" else ""
    text = HEADER.format(workload=workload, seeds=list(range(seeds)), options=options)
    text += "".join(RUN.format(method=method, world_size=WORLD_SIZES[method]) for method in methods)
    path = folder / "startup.toml"
    path.write_text(text)
    return path
