"""The import rules of docs/design.md's Modules table (harness and methods rows), checked on the source (every
import, at any depth).

Each row whose first column names a harness folder or module says what its modules may import besides themselves;
no harness module imports methods (methods are found by name, through harness/registry.py); and the table has a row
for every harness package and top-level module.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
#: Every module under harness/ and methods/, by dotted name (a package by its own name).
KNOWN = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
         for top in ("harness", "methods") for p in (ROOT / top).rglob("*.py")}


@dataclass(frozen=True)
class Row:
    """One row of the table: its first column as written, the dotted name it covers and what it may import."""

    text: str
    name: str  # harness.suite (a folder) or harness.registry (a module)
    allowed: tuple[str, ...]  # dotted names; "harness" means everything in harness/
    lives: str  # the "what lives there" cell


def _dotted(path: str) -> str:
    """`harness/suite/`, `net/spec`, `registry.py` -> harness.suite, harness.net.spec, harness.registry."""
    path = path.strip().strip("/").removesuffix(".py")
    if not path.startswith(("harness", "methods")):
        path = "harness/" + path
    return path.replace("/", ".")


def parse_allowed(cell: str) -> tuple[str, ...]:
    """A "may import" cell -> dotted names. `—`: none; "everything in `harness/`": harness; `report` (stats, tables):
    harness.report.stats and harness.report.tables when every word in the parentheses is a module of the package,
    else the remark narrows nothing and the name stands for the whole package (or module)."""
    allowed = []
    for name, remark in re.findall(r"`([^`]+)`(?:\s*\(([^)]*)\))?", cell):
        base = _dotted(name)
        parts = [_dotted(f"{name.strip('/')}/{word.strip(' `')}") for word in remark.split(",")] if remark else []
        allowed += parts if parts and all(p in KNOWN for p in parts) else [base]
    return tuple(allowed)


def parse_table(text: str, top: str = "harness") -> list[Row]:
    """The rows of the first markdown table under "## Modules" whose folder or module lies under `top`."""
    section = text.split("\n## Modules", 1)[1]
    lines = [line.strip() for line in section.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    header, body = table[0], [cells for cells in table[1:] if not set("".join(cells)) <= set("-: ")]
    column = next((i for i, cell in enumerate(header) if "may import" in cell), len(header) - 1)
    rows = []
    for cells in body:
        first = cells[0].strip("` ")
        if first.startswith(top + "/"):
            rows.append(Row(first, _dotted(first), parse_allowed(cells[column]), cells[1]))
    return rows


ROWS = parse_table(DESIGN.read_text())
METHOD_ROWS = parse_table(DESIGN.read_text(), "methods")


def _module_name(path: Path) -> str:
    try:
        parts = path.resolve().relative_to(ROOT).with_suffix("").parts
    except ValueError:
        parts = (path.stem,)
    return ".".join(parts).removesuffix(".__init__")


def _known(name: str) -> str | None:
    """The longest prefix of `name` that is a harness or methods module, or None (a library)."""
    while name and name not in KNOWN:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, module: str | None = None) -> set[str]:
    """The harness and methods modules `path` (the module `module`, by default the one its path names) imports
    anywhere, function-local imports too, relative ones resolved; `from package import name` counts as importing
    package.name when that is a module, else as the package."""
    here = module or _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(filter(None, (_known(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names.update(filter(None, (_known(f"{base}.{alias.name}") for alias in node.names)))
    return names


def _row_of(module: str, rows: list[Row] = ROWS) -> Row | None:
    """The most specific row covering `module` (harness.run.loop -> the `harness/run/` row)."""
    covering = [r for r in rows if module == r.name or module.startswith(r.name + ".")]
    return max(covering, key=lambda r: len(r.name), default=None)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _harness_files() -> list[Path]:
    return sorted((ROOT / "harness").rglob("*.py"))


def test_the_may_import_cells_parse():
    assert parse_allowed("—") == ()
    assert parse_allowed("everything in `harness/`") == ("harness",)
    assert parse_allowed("`report` (stats, tables), `suite/files`") == ("harness.report.stats", "harness.report.tables",
                                                                      "harness.suite.files")
    assert parse_allowed("`method`, `data/workload` (to check what it loads)") == ("harness.method",
                                                                                   "harness.data.workload")
    assert parse_allowed("`harness`, `methods/blocks`") == ("harness", "methods.blocks")


def test_the_table_is_the_first_under_modules_and_only_its_harness_rows_count():
    text = ("# t\n| a | b | may import |\n| - | - | - |\n| `harness/x/` | before | `y` |\n## Modules\nprose\n\n"
            "| folder / module | what lives there | may import |\n| --- | --- | --- |\n"
            "| `harness/suite/` | `spec.py` | `net/spec`, `registry` (names only) |\n"
            "| `methods/local/` | anything | `harness`, `methods/blocks` |\n| `harness/trace.py` | t | — |\n\n"
            "| `harness/later/` | another table | `z` |\n")
    assert parse_table(text) == [Row("harness/suite/", "harness.suite", ("harness.net.spec", "harness.registry"),
                                     "`spec.py`"),
                                 Row("harness/trace.py", "harness.trace", (), "t")]
    assert {"harness.suite", "harness.registry", "harness.cli"} <= {r.name for r in ROWS}


def test_every_harness_package_and_top_level_module_has_a_row():
    harness = ROOT / "harness"
    wanted = {f"harness/{p.parent.name}/" for p in harness.glob("*/__init__.py")}
    wanted |= {f"harness/{p.name}" for p in harness.glob("*.py") if p.name != "__init__.py"}
    rows = {r.text for r in ROWS}
    missing = sorted(wanted - rows)
    assert not missing, f"docs/design.md's Modules table has no row for {', '.join(missing)}"
    stale = sorted(r.text for r in ROWS if r.name not in KNOWN)
    assert not stale, f"docs/design.md's Modules table has rows for what does not exist: {', '.join(stale)}"


def test_the_files_a_row_names_exist():
    """`x.py` in a folder row is that folder's module (`suite/files.py`: one under harness/), so a rename that leaves
    the table behind fails here."""
    bad = []
    for row in ROWS:
        folder = ROOT / row.text if row.text.endswith("/") else (ROOT / row.text).parent
        for name in re.findall(r"`([^`]+\.py)`", row.lives):
            path = ROOT / "harness" / name if "/" in name else folder / name
            if not path.is_file():
                bad.append(f"the row `{row.text}` names {name}, which is not {path.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_each_harness_module_imports_only_what_its_row_allows():
    bad = []
    for path in _harness_files():
        row = _row_of(_module_name(path))
        if row is None:
            continue  # the row check above names it
        own = (row.name,)
        for name in sorted(_imports(path)):
            if not name.startswith("harness") or _within(name, own) or _within(name, row.allowed):
                continue
            bad.append(f"{path.relative_to(ROOT)} imports {name}, which the row `{row.text}` does not allow "
                       f"(may import: {', '.join(row.allowed) or 'nothing'})")
    assert not bad, "\n".join(bad)


def test_no_harness_module_imports_methods():
    bad = [f"{path.relative_to(ROOT)} imports {name} (harness names methods only as strings, harness/registry.py)"
           for path in _harness_files() for name in sorted(_imports(path)) if _within(name, ("methods",))]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_function_local_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from harness.claims.evaluate import claims_html\n")
    assert "harness.claims.evaluate" in _imports(module)


def test_the_check_names_imported_modules_and_resolves_relative_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from harness.report import stats, table_html\nimport harness.net.spec\nfrom torch import nn\n"
                      "from . import tables\nfrom .. import results\nfrom ..suite.spec import RunSpec\n")
    # as if it were harness/report/stats.py; table_html is no module: the package itself is imported
    assert _imports(module, "harness.report.stats") == {"harness.report.stats", "harness.report", "harness.net.spec",
                                                        "harness.report.tables", "harness.results",
                                                        "harness.suite.spec"}
    assert _module_name(ROOT / "harness" / "report" / "__init__.py") == "harness.report"


def test_every_methods_package_with_modules_has_a_row_and_keeps_to_it():
    """methods/ rows too: every package holding modules (or top-level module) has a row, and each module imports
    only the methods modules its row allows (harness is open to every method: `harness` in the cell)."""
    methods = ROOT / "methods"
    wanted = {f"methods/{p.parent.relative_to(methods).as_posix()}/" for p in methods.rglob("*.py")
              if p.name != "__init__.py" and p.parent != methods}
    wanted |= {f"methods/{p.name}" for p in methods.glob("*.py") if p.name != "__init__.py"}
    rows = {r.text for r in METHOD_ROWS}
    assert not sorted(wanted - rows), f"docs/design.md's Modules table has no row for {sorted(wanted - rows)}"
    bad = []
    for path in sorted(methods.rglob("*.py")):
        row = _row_of(_module_name(path), METHOD_ROWS)
        if row is None:
            continue  # a namespace package's __init__.py
        for name in sorted(_imports(path)):
            if not name.startswith("methods") or _within(name, (row.name,)) or _within(name, row.allowed):
                continue
            bad.append(f"{path.relative_to(ROOT)} imports {name}, which the row `{row.text}` does not allow "
                       f"(may import: {', '.join(row.allowed) or 'nothing'})")
    assert not bad, "\n".join(bad)


def test_tests_live_in_a_folder_per_area():
    """No test module at the top of tests/ (only the shared helpers and conftest), and every folder's tests are
    named after what they test: test_<something>.py."""
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    folders = [d for d in tests.iterdir() if d.is_dir() and any(d.glob("*.py"))]
    assert len(folders) >= 10
    for folder in folders:
        assert all(p.name.startswith("test_") for p in folder.glob("*.py")), folder
