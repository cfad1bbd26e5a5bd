"""The report page as its reader sees it: index.html opened in headless Chromium, every image loaded, nothing wider
than the page, the rankings section and the time-to-target survival figure present; a screenshot goes to the test's
temp folder."""

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
from test_report_lm import write_lm_run

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
  }).map(el => el.tagName + (el.className ? "." + el.className : "") + (el.alt ? "[" + el.alt + "]" : "")
        + "=" + Math.round(el.getBoundingClientRect().width));
  const out = document.createElement("pre");
  out.id = "checks";
  out.textContent = JSON.stringify({
    images: images.length,
    broken: images.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.alt),
    page_width: document.documentElement.scrollWidth, window_width: document.documentElement.clientWidth,
    wide: wide, rankings: !!document.getElementById("rankings"),
    verdicts: [...document.querySelectorAll("#rankings .verdict")].map(p => p.textContent),
    ranking_columns: Object.fromEntries([...document.querySelectorAll("#rankings h3")].map(h => {
      let table = h.nextElementSibling;
      while (table && !table.querySelector("table")) table = table.nextElementSibling;
      return [h.textContent, table ? [...table.querySelectorAll("th")].map(th => th.textContent) : []];
    })),
    per_label_columns: [...document.querySelectorAll("#per-label table")].map(
      t => [...t.querySelectorAll("th")].map(th => th.textContent)),
    tooltips: [...document.querySelectorAll("#per-label .setup")].map(s => s.title),
    survival: images.filter(img => /survival/.test(img.alt)).map(img => ({
      alt: img.alt, loaded: img.complete && img.naturalWidth > 0,
      caption: img.closest("figure")?.querySelector("figcaption")?.textContent || ""})),
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
    # Time to target as survival: the figure is on the page, and its caption says how censored and diverged runs
    # are marked and names the label whose seeds never arrived (method5 diverged on both).
    [survival] = checks["survival"]
    assert survival["alt"] == "time_to_target_survival.png" and survival["loaded"], survival
    caption = survival["caption"]
    assert "Kaplan–Meier" in caption and "censored at its train time, marked |" in caption, caption
    assert "A diverged run never reaches the target" in caption and "marked x" in caption, caption
    assert "method5 microbatches=4 replicate=0 lanes=2 x2 (0 of 2 reached; 2 diverged)" in caption, caption


def test_a_report_with_a_language_model_reads_it_by_its_loss(tmp_path: Path) -> None:
    suite = tmp_path / "mix"
    for seed in (0, 1, 2):
        write_run(suite, "ddp", "ddp x2", seed, "completed", [(1.0, 0.5), (2.0, 0.93), (3.0, 0.95)])
        write_run(suite, "qsgd", "qsgd x2", seed, "completed", [(1.5, 0.5), (2.5, 0.93), (3.5, 0.95)])
        write_lm_run(suite, "sgd", "sgd adamw x1", seed, [(1.0, 3.5), (2.0, 3.0), (3.0, 2.8)])
        write_lm_run(suite, "ddp", "ddp adamw x2", seed, [(2.0, 3.4), (4.0, 2.95), (6.0, 2.7)])
    checks = measured(build.write_report(suite), tmp_path)
    assert checks["images"] >= 6 and checks["broken"] == [], checks
    assert checks["page_width"] <= checks["window_width"] and checks["wide"] == [], checks
    columns = checks["ranking_columns"]
    assert set(columns) == {"digits-mlp", "shakespeare-gpt"}, columns
    assert "held-out loss" in columns["shakespeare-gpt"] and "perplexity" in columns["shakespeare-gpt"], columns
    assert not any("accuracy" in c for c in columns["shakespeare-gpt"]), columns
    assert "final accuracy" in columns["digits-mlp"], columns
    # The per-label table: one part per reading, the language model's with no accuracy column.
    by_loss = [c for c in checks["per_label_columns"] if any("held-out loss" in h for h in c)]
    assert len(checks["per_label_columns"]) == 2 and len(by_loss) == 1, checks["per_label_columns"]
    assert not any("accuracy" in h for h in by_loss[0]), by_loss
    assert "ddp x2 on shakespeare-gpt (context=32); params: batch_size=16" in checks["tooltips"], checks
