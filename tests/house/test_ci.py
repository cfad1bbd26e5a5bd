"""CI cannot pass on nothing: the tests session and .ci/run treat pytest's "no tests ran" (exit 5) as a failure, and
CI never lets the browser test skip."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _session_calls(name: str) -> list[ast.Call]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return [n for n in ast.walk(function) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "run"]


def test_the_tests_session_fails_when_pytest_ran_no_test():
    calls = _session_calls("tests")
    assert calls, "the tests session runs pytest"
    for call in calls:
        codes = [k.value for k in call.keywords if k.arg == "success_codes"]
        accepted = {c.value for code in codes for c in getattr(code, "elts", [])}
        assert 5 not in accepted, "the tests session accepts pytest's exit 5 (no tests ran)"


def test_ci_neither_accepts_no_tests_nor_lets_the_browser_test_skip():
    script = (ROOT / ".ci" / "run").read_text()
    assert "-ne 5" not in script and "success_codes" not in script
    assert 'export CI="${CI:-1}"' in script and "\nif command -v chromium > /dev/null; then export CI" not in script


def test_pytest_exits_5_when_a_selection_matches_nothing(tmp_path):
    """What the session relies on: a selection that matches no test is exit 5, which nox then fails on."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
                             "-k", "no_test_has_this_name"], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 5, result.stdout + result.stderr
