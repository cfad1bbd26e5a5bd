"""Every relative link in README.md and docs/ points at a file that exists and, with an anchor, at one of its
headings (GitHub's anchors), as submitit's test_documentation checks its docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens and underscores dropped, spaces to hyphens."""
    text = re.sub(r"`|\*", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            out.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            out.append(f"{target} (no heading with that anchor)")
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert not broken(page), f"{page.relative_to(ROOT)}: broken links: {broken(page)}"


def test_the_checker_finds_a_broken_link_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n## Two words\n[ok](a.md#two-words) [bad](b.md) [gone](a.md#three)\n"
                                   "```\n[in code](nowhere.md)\n```\n[web](https://example.org)\n")
    assert broken(tmp_path / "a.md") == ["b.md (no such file)", "a.md#three (no heading with that anchor)"]
    assert slug("pb: Pipelined Backpropagation (Kosson et al., MLSys 2021)") == \
        "pb-pipelined-backpropagation-kosson-et-al-mlsys-2021"


def test_the_readme_is_a_front_page():
    """At most 200 lines, the two quickstart commands within the first 40, and nothing a reader cannot look up: no
    issue numbers, no 'these machines'."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    head = "\n".join(lines[:40])
    assert "python -m pip install nox && nox -s smoke" in head and "python -m pip install nox && nox -s tests" in head
    text = "\n".join(lines)
    assert not re.search(r"\bissues? \d+", text) and "these machines" not in text
