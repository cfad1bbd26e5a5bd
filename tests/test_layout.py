"""The import rules docs/design.md states per package, checked on the source (every import, at any depth)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: package -> the harness modules (or packages) it may import besides itself (docs/design.md, the map's last column).
ALLOWED = {
    "harness.report": ("harness.results", "harness.trace", "harness.net.spec", "harness.suite.spec"),
    "harness.claims": ("harness.report", "harness.suite.files", "harness.results"),
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _outside(package: str, allowed: tuple[str, ...]) -> list[str]:
    folder = ROOT / package.replace(".", "/")
    bad = []
    for path in sorted(folder.glob("*.py")):
        for name in _imports(path):
            if not name.startswith(("harness", "methods")) or name.startswith(package):
                continue
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_each_package_imports_only_what_the_design_allows():
    bad = [line for package, allowed in ALLOWED.items() for line in _outside(package, allowed)]
    assert bad == []


def test_the_check_sees_a_function_local_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from harness.claims.evaluate import claims_html\n")
    assert "harness.claims.evaluate" in _imports(module)
