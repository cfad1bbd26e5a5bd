"""The ranks' malloc policy: `retain` keeps freed memory mapped (a re-allocation faults no fresh pages), `system`
leaves glibc's defaults (a large block faults afresh each time); the suite key reaches the spec and the manifest."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.run import allocator
from harness.suite.expand import expand_suite
from harness.suite.files import FileError

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter (mallopt lasts for the process): malloc, touch, free and malloc, touch again 64 MiB, and
# count the minor page faults of each touch. 64 MiB is above glibc's largest dynamic mmap threshold (32 MiB), so
# under its defaults every allocation is a fresh mmap.
_PROBE = """
import ctypes, json, resource, sys
from harness.run.allocator import configure
text = configure(sys.argv[1])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = 64 << 20
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pointer = libc.malloc(size)
    libc.memset(pointer, 1, size)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    libc.free(pointer)
print(json.dumps({"text": text, "faults": faults}))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def _probe(policy: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PROBE, policy], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@glibc_only
def test_retain_reuses_freed_memory_and_system_faults_it_in_again():
    retain, system = _probe("retain"), _probe("system")
    assert retain["text"].startswith("retain: glibc") and "refused" not in retain["text"]
    assert system["text"].startswith("system")
    first, again = system["faults"]
    assert first >= 16  # the pages were faulted in at all (16 even with 2 MiB transparent huge pages would be 32)
    assert again >= first / 2, system  # glibc's defaults: unmapped at free, faulted in afresh
    first, again = retain["faults"]
    assert first >= 16 and again <= first / 10, retain  # retained: the second block reuses the first's pages


def test_system_touches_nothing_and_a_bad_policy_is_an_error(monkeypatch):
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda *a: pytest.fail("mallopt called"))
    assert allocator.configure("system") == "system: the C library's malloc defaults"
    with pytest.raises(ValueError, match="'retain' or 'system'"):
        allocator.configure("jemalloc")  # type: ignore[arg-type]


def test_retain_off_glibc_changes_nothing_and_says_so(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda *a: pytest.fail("mallopt called"))
    assert "left as is" in allocator.configure("retain")


def _suite(tmp_path: Path, top: str, run: str) -> Path:
    path = tmp_path / "a.toml"
    path.write_text(f'name = "a"\nworkload = "digits-mlp"\n{top}[budget]\nmax_steps = 2\n'
                    f'[[run]]\nmethod = "sgd"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n{run}')
    return path


def test_the_allocator_key_resolves_into_the_spec(tmp_path):
    assert [s.allocator for s in expand_suite(_suite(tmp_path, "", ""))] == ["retain", "retain"]
    specs = expand_suite(_suite(tmp_path, 'allocator = "system"\n', 'allocator = "retain"\n'))
    assert [s.allocator for s in specs] == ["system", "retain"]
    assert json.loads(specs[0].model_dump_json())["allocator"] == "system"  # what spec.json holds


@pytest.mark.parametrize("top,run,field", [
    ('allocator = "jemalloc"\n', "", "allocator"), ("allocator = 1\n", "", "allocator"),
    ("", 'allocator = "none"\n', "run[1].allocator"),
])
def test_a_bad_allocator_names_the_file_and_field(tmp_path, top, run, field):
    path = _suite(tmp_path, top, run)
    with pytest.raises(FileError, match=f"^{re.escape(f'{path}: {field}: ')}"):
        expand_suite(path)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@glibc_only
def test_the_manifest_says_what_the_ranks_did(tmp_path, dtbench_here):
    path = _suite(tmp_path, 'threads_per_rank = 1\nallocator = "system"\n', 'allocator = "retain"\n')
    proc = dtbench_here("run", str(path), "--out", str(tmp_path / "out"), "--quiet", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    runs = tmp_path / "out" / "a"
    sgd = json.loads((runs / "sgd-digits-mlp-w1-s0" / "manifest.json").read_text())
    ddp = json.loads((runs / "ddp-digits-mlp-w2-s0" / "manifest.json").read_text())
    assert sgd["allocator"] == "system: the C library's malloc defaults"
    assert ddp["allocator"].startswith("retain: glibc") and "M_TRIM_THRESHOLD=" in ddp["allocator"]
