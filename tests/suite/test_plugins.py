"""Methods and workloads from outside the tree: an installed package's entry points, and package.module:Class paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import registry
from harness.suite.expand import expand_suite
from harness.suite.files import FileError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dtbench-plugin-example"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The example package installed by pip into a folder of its own; the environment that sees it."""
    pytest.importorskip("setuptools", reason="pip builds the example with the environment's setuptools (offline)")
    source, target = tmp_path_factory.mktemp("src") / "example", tmp_path_factory.mktemp("site")
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))  # builds leave files
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)], check=True, capture_output=True,
                   timeout=300)
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    return env


def _cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=cwd)


@pytest.mark.slow
def test_an_installed_method_and_a_path_reference_run_through_a_suite(installed, tmp_path):
    listing = _cli(installed, "list")
    assert listing.returncode == 0, listing.stderr
    line = next(x for x in listing.stdout.splitlines() if x.strip().startswith("clipped-sgd"))
    assert "entry point of dtbench-plugin-example==0.1.0 (dtbench_plugin_example.method:ClippedSGD)" in line
    assert any(x.strip().startswith("blobs-mlp") for x in listing.stdout.splitlines())

    suite = tmp_path / "plugins.toml"
    suite.write_text(textwrap.dedent("""
        name = "plugins"
        workload = "blobs-mlp"
        seeds = [0]
        [budget]
        max_epochs = 1
        [[run]]
        method = "clipped-sgd"
        params = { max_norm = 0.5 }
        [[run]]
        method = "dtbench_plugin_example.method:ClippedSGD"
        label = "by path"
        """))
    done = _cli(installed, "run", str(suite), "--out", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    specs = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "out" / "plugins").glob("*/spec.json")}
    assert len(specs) == 2
    by_origin = sorted(spec["method_origin"] for spec in specs.values())
    assert by_origin == ["entry-point dtbench-plugin-example==0.1.0 dtbench_plugin_example.method:ClippedSGD",
                         "path dtbench_plugin_example.method:ClippedSGD"]
    assert {spec["workload_origin"] for spec in specs.values()} == {
        "entry-point dtbench-plugin-example==0.1.0 dtbench_plugin_example.workload:BLOBS_MLP"}
    for run_id in specs:
        status = json.loads((tmp_path / "out" / "plugins" / run_id / "status.json").read_text())
        assert status["state"] == "completed" and status["final"]["test_accuracy"] > 0.5


def _suite(tmp_path: Path, method: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\nworkload = "digits-mlp"\n[budget]\nmax_steps = 1\n[[run]]\nmethod = "{method}"\n')
    return path


@pytest.mark.parametrize(("method", "message"), [
    ("nosuch", "run[0].method: unknown method 'nosuch' (known: 1f1b, "),
    ("nosuch_module:Thing", "run[0].method: cannot import 'nosuch_module' for 'nosuch_module:Thing'"),
    ("harness.method:Nothing", "run[0].method: module 'harness.method' has no attribute 'Nothing'"),
    ("harness.method:TrainParams", "run[0].method: 'harness.method:TrainParams' (path) is not a subclass of "
                                   "harness.method.Method"),
    ("harness.method:Method", "run[0].method: 'harness.method:Method' (path) is abstract"),
    ("harness.method", "run[0].method: unknown method 'harness.method'"),
])
def test_a_bad_method_reference_is_one_line_naming_the_field(tmp_path, method, message):
    with pytest.raises(FileError) as err:
        expand_suite(_suite(tmp_path, method))
    assert str(err.value).startswith(f"{tmp_path / 's.toml'}: {message}") and "\n" not in str(err.value)


def test_a_path_reference_resolves_and_records_its_origin(tmp_path):
    specs = expand_suite(_suite(tmp_path, "methods.reference.sgd:SGD"))
    assert specs[0].method == "methods.reference.sgd:SGD" and specs[0].method_origin == "path methods.reference.sgd:SGD"
    assert specs[0].workload_origin == "builtin harness.workloads.builtin:DIGITS_MLP"
    assert specs[0].run_id == "SGD-digits-mlp-w1-s0" and specs[0].label == "sgd x1"
    builtin = expand_suite(_suite(tmp_path, "sgd"))[0]
    assert builtin.method_origin == "builtin methods.reference.sgd:SGD" and builtin.run_id == "sgd-digits-mlp-w1-s0"


def test_the_cli_exits_2_with_one_line_for_a_bad_reference(tmp_path):
    from harness.cli import main

    assert main(["run", str(_suite(tmp_path, "harness.method:TrainParams")), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_workload_references_accept_a_workload_or_a_factory():
    workload, entry = registry.WORKLOADS.resolve("harness.workloads.builtin:DIGITS_CNN")
    assert workload.name == "digits-cnn" and entry.kind == "path"
    with pytest.raises(registry.RegistryError, match="is neither a Workload nor a function returning one"):
        registry.WORKLOADS.resolve("harness.workloads.workload:Workload")
    with pytest.raises(registry.RegistryError,
                       match="returned a Sequential, not a harness.workloads.workload.Workload"):
        registry.WORKLOADS.resolve("harness.models.simple:digits_cnn")
