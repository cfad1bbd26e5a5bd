"""The report page as its reader sees it: index.html opened in headless Chromium, every image loaded, nothing wider
than the page, the rankings section present; a screenshot goes to the test's temp folder."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report import write_run

from harness.report import build

pytestmark = pytest.mark.slow

#: Runs in the page once it has loaded; writes what it measured into <pre id="checks"> as JSON.
CHECKS = """
<script>
window.addEventListener("load", () => {
  const body = document.body, limit = body.getBoundingClientRect().width + 1;
  const images = [...document.images];
  const wide = [...body.querySelectorAll("*")].filter(el => {
    if (el.closest(".scroll")) return false;  // a table's own box scrolls inside the page
    return el.getBoundingClientRect().width > limit;
  }).map(el => el.tagName + (el.className ? "." + el.className : ""));
  const out = document.createElement("pre");
  out.id = "checks";
  out.textContent = JSON.stringify({
    images: images.length,
    broken: images.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.alt),
    page_width: document.documentElement.scrollWidth, window_width: document.documentElement.clientWidth,
    wide: wide, rankings: !!document.getElementById("rankings"),
    verdicts: [...document.querySelectorAll("#rankings .verdict")].map(p => p.textContent),
  });
  body.appendChild(out);
});
</script>
"""


def chromium() -> str:
    """The Chromium binary; CI installs Debian's package (.ci/run), elsewhere the test is skipped without it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run: apt-get install chromium)")
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    return found


def browse(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium on a page with the flags this closed network needs (no background connections)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,4000", "--virtual-time-budget=10000"]
    return subprocess.run([chromium(), *flags, *args, page.resolve().as_uri()], capture_output=True, text=True,
                          timeout=120)


def measured(index: Path, tmp_path: Path) -> dict:
    """Open a copy of index.html with CHECKS added; -> what CHECKS measured (and a screenshot beside the copy)."""
    copy = index.with_name("checked.html")
    copy.write_text(index.read_text(encoding="utf-8").replace("</body>", CHECKS + "</body>"), encoding="utf-8")
    done = browse(copy, tmp_path, "--dump-dom")
    found = re.search(r'<pre id="checks">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found, f"chromium wrote no checks (exit {done.returncode}): {done.stderr[-2000:]}"
    browse(copy, tmp_path, f"--screenshot={tmp_path / 'report.png'}")
    return json.loads(html.unescape(found.group(1)))


def test_the_report_loads_fits_the_page_and_ranks(tmp_path: Path) -> None:
    suite = tmp_path / "smoke"
    # Sixteen labels with long names, one of them diverged: a page likely to overflow.
    for k in range(16):
        method = "ddp" if k == 0 else f"method{k}"
        label = "ddp x2" if k == 0 else f"method{k} microbatches=4 replicate=0 lanes=2 x2"
        for seed in (0, 1):
            write_run(suite, method, label, seed, "completed" if k != 5 else "diverged",
                      [(1.0 + 0.1 * k, 0.5), (2.0 + 0.1 * k, 0.92), (3.0, 0.95)])
    index = build.write_report(suite)
    checks = measured(index, tmp_path)
    assert checks["images"] >= 6 and checks["broken"] == [], checks
    assert checks["page_width"] <= checks["window_width"], checks
    assert checks["wide"] == [], checks
    # method1 reaches 0.9 at 2.1 s against ddp's 2.0 s, ...: ddp is fastest, and the verdict says so.
    assert checks["rankings"] and checks["verdicts"] == [
        "On digits-mlp, ddp x2 reached the target 0.9 fastest, in 2 s (mean of 2 runs): it is the baseline."], checks
    assert (tmp_path / "report.png").stat().st_size > 10_000
