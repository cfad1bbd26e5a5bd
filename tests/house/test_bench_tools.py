"""Tests of the performance-tracking tools (benchmarks/asv_tools/regress.py, summary.py, asv_results.py) on small result
files in asv's format, and of the slowdown fixture that the regression check must catch. No asv run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "asv_tools"))

import asv_results  # noqa: E402
import regress  # noqa: E402
import summary  # noqa: E402

COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
           "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
FIXTURE = "fixture.Fixture.time_fixture_loop"
FIXTURE_RATIO = "fixture.Fixture.track_fixture_vs_reference"
ROUNDTRIP = "compressors.Roundtrip.time_roundtrip"
PAYLOAD = "compressors.Payload.track_payload_vs_fp32"
DDP_RATIO = "runner.DDPStep.track_ddp_vs_torch_ddp"
PARAMS = [["'copy'", "'onebit'"], ["1000000", "25000000"]]
BENCHMARKS = {
    FIXTURE: {"name": FIXTURE, "type": "time", "unit": "seconds", "param_names": [], "params": []},
    ROUNDTRIP: {"name": ROUNDTRIP, "type": "time", "unit": "seconds", "param_names": ["compressor", "numel"],
                "params": PARAMS},
    PAYLOAD: {"name": PAYLOAD, "type": "track", "unit": "x fp32", "param_names": ["compressor", "numel"],
              "params": PARAMS},
    DDP_RATIO: {"name": DDP_RATIO, "type": "track", "unit": "x torch DDP", "param_names": [], "params": []},
    FIXTURE_RATIO: {"name": FIXTURE_RATIO, "type": "track", "unit": "x reference", "param_names": [], "params": []},
    "version": 2,
}


def spread(value: float | None, width: float = 0.02) -> tuple[float | None, float | None]:
    """A tight 99% interval around a value (None for a failed one)."""
    return (None, None) if value is None else (value * (1 - width), value * (1 + width))


def time_row(values: list[float | None], params: list, width: float = 0.02) -> list:
    """One benchmark's row in asv's results format (result_columns order), with intervals of +-width."""
    low = [spread(v, width)[0] for v in values]
    high = [spread(v, width)[1] for v in values]
    return [values, params, "0" * 64, 1795947970819, 1.0, low, high, low, high, [1] * len(values),
            [10] * len(values)]


def track_row(values: list[float | None], params: list) -> list:
    return [values, params, "0" * 64, 1795947970819, 0.1]


def write_results(results_dir: Path, commit: str, date_ms: int, rows: dict[str, list], env: str = "existing-py",
                  machine: str = "box") -> Path:
    """One asv results file (format version 2) and the benchmarks.json beside the machines' folders."""
    folder = results_dir / machine
    folder.mkdir(parents=True, exist_ok=True)
    (results_dir / "benchmarks.json").write_text(json.dumps(BENCHMARKS))
    data = {"commit_hash": commit, "env_name": env, "date": date_ms, "params": {"machine": machine},
            "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": COLUMNS, "results": rows,
            "durations": {}, "version": 2}
    path = folder / f"{commit[:8]}-{env}.json"
    path.write_text(json.dumps(data))
    return path


def baseline_rows(fixture: float = 0.010, roundtrip: list | None = None, ratio: float = 1.05) -> dict[str, list]:
    return {
        FIXTURE: time_row([fixture], []),
        ROUNDTRIP: time_row(roundtrip or [0.0002, 0.012, 0.005, 0.18], PARAMS),
        PAYLOAD: track_row([1.0, 1.0, 0.03125, 0.03125], PARAMS),
        DDP_RATIO: track_row([ratio], []),
    }


def compare_files(tmp_path: Path, base: dict, new: dict, **options) -> pd.DataFrame:
    results = tmp_path / "results"
    a = asv_results.load_results(write_results(results, "a" * 40, 1, base))
    b = asv_results.load_results(write_results(results, "b" * 40, 2, new))
    return regress.compare(a, b, **options)


def status_of(table: pd.DataFrame, benchmark: str, params: str = "") -> str:
    rows = table[(table["benchmark"] == benchmark) & (table["params"] == params)]
    assert len(rows) == 1, f"{benchmark} ({params}): {len(rows)} rows in\n{table}"
    return rows["status"].iloc[0]


# -- reading asv's format ---------------------------------------------------------------------------------------

def test_load_results_expands_parameter_combinations_in_product_order(tmp_path):
    rows = baseline_rows(roundtrip=[0.0002, 0.012, None, 0.18])
    table = asv_results.load_results(write_results(tmp_path, "a" * 40, 1, rows))
    roundtrip = table[table["benchmark"] == ROUNDTRIP].set_index("params")
    assert list(roundtrip.index) == ["compressor=copy, numel=1000000", "compressor=copy, numel=25000000",
                                     "compressor=onebit, numel=1000000", "compressor=onebit, numel=25000000"]
    assert roundtrip.loc["compressor=copy, numel=25000000", "value"] == pytest.approx(0.012)
    assert roundtrip.loc["compressor=onebit, numel=25000000", "ci_high"] == pytest.approx(0.18 * 1.02)
    assert pd.isna(roundtrip.loc["compressor=onebit, numel=1000000", "value"])  # failed combination
    assert set(roundtrip["unit"]) == {"seconds"}
    fixture = table[table["benchmark"] == FIXTURE]
    assert list(fixture["params"]) == [""] and fixture["value"].iloc[0] == pytest.approx(0.010)
    ratio = table[table["benchmark"] == DDP_RATIO]
    assert ratio["unit"].iloc[0] == "x torch DDP" and pd.isna(ratio["ci_low"].iloc[0])


def test_types_and_units_fall_back_to_the_name_prefix(tmp_path):
    rows = {"m.C.peakmem_x": track_row([1e8], []), "m.time_y": time_row([1.0], [])}
    table = asv_results.load_results(write_results(tmp_path, "a" * 40, 1, rows), benchmarks={})
    units = dict(zip(table["benchmark"], table["unit"], strict=True))
    assert units == {"m.C.peakmem_x": "bytes", "m.time_y": "seconds"}


def test_find_results_by_path_and_by_commit(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    path = write_results(tmp_path, head, 1, baseline_rows())
    assert asv_results.find_results(str(path), tmp_path) == path
    assert asv_results.find_results("HEAD", tmp_path, repo=ROOT) == path
    with pytest.raises(asv_results.ResultsError, match="no asv results for HEAD~1"):
        asv_results.find_results("HEAD~1", tmp_path, repo=ROOT)
    with pytest.raises(asv_results.ResultsError, match="neither a results file nor a commit"):
        asv_results.find_results("no-such-ref-xyz", tmp_path, repo=ROOT)


# -- the comparison -------------------------------------------------------------------------------------------

def test_a_slowdown_beyond_the_factor_is_a_regression(tmp_path):
    table = compare_files(tmp_path, baseline_rows(fixture=0.010), baseline_rows(fixture=0.015))
    assert status_of(table, FIXTURE) == "regression"
    assert table.loc[table["benchmark"] == FIXTURE, "ratio"].iloc[0] == pytest.approx(1.5)
    assert table["status"].iloc[0] == "regression"  # what needs attention comes first
    assert (table["status"][table["benchmark"] != FIXTURE] == "ok").all()


def test_a_change_within_the_factor_passes(tmp_path):
    table = compare_files(tmp_path, baseline_rows(fixture=0.010, ratio=1.05),
                          baseline_rows(fixture=0.012, ratio=1.3))
    assert status_of(table, FIXTURE) == "ok"  # 1.2 < 1.25
    assert status_of(table, DDP_RATIO) == "ok"  # 1.24
    assert not table["status"].isin(regress.FAILING).any()


def test_tracked_values_regress_on_the_ratio_alone(tmp_path):
    slower = baseline_rows(ratio=1.05 * 1.4)
    slower[PAYLOAD] = track_row([1.0, 1.0, 0.0625, 0.03125], PARAMS)  # onebit at 1M doubled its bytes
    table = compare_files(tmp_path, baseline_rows(), slower)
    assert status_of(table, DDP_RATIO) == "regression"
    assert status_of(table, PAYLOAD, "compressor=onebit, numel=1000000") == "regression"
    assert status_of(table, PAYLOAD, "compressor=onebit, numel=25000000") == "ok"


def test_overlapping_intervals_are_noise_unless_strict(tmp_path):
    results = tmp_path / "results"
    wide_base = baseline_rows(fixture=0.010)
    wide_base[FIXTURE] = time_row([0.010], [], width=0.4)  # 99% CI 6-14 ms
    wide_new = baseline_rows(fixture=0.013)
    wide_new[FIXTURE] = time_row([0.0135], [], width=0.4)  # 8.1-18.9 ms: overlaps
    a = asv_results.load_results(write_results(results, "a" * 40, 1, wide_base))
    b = asv_results.load_results(write_results(results, "b" * 40, 2, wide_new))
    assert status_of(regress.compare(a, b), FIXTURE) == "noise"
    assert status_of(regress.compare(a, b, strict=True), FIXTURE) == "regression"


def test_failures_new_and_missing_benchmarks(tmp_path):
    new = baseline_rows(roundtrip=[0.0002, None, 0.005, 0.18])  # copy at 25M now fails
    del new[DDP_RATIO]  # not run
    new["report.WriteReport.time_write_report"] = time_row([2.5], [])
    base = baseline_rows(roundtrip=[0.0002, 0.012, None, 0.18])  # onebit at 1M failed before
    table = compare_files(tmp_path, base, new)
    assert status_of(table, ROUNDTRIP, "compressor=copy, numel=25000000") == "failed"
    assert status_of(table, ROUNDTRIP, "compressor=onebit, numel=1000000") == "fixed"
    assert status_of(table, DDP_RATIO) == "missing"
    assert status_of(table, "report.WriteReport.time_write_report") == "new"
    assert list(table["status"][table["status"].isin(regress.FAILING)]) == ["failed"]


def test_improvements_do_not_fail(tmp_path):
    table = compare_files(tmp_path, baseline_rows(fixture=0.010), baseline_rows(fixture=0.005))
    assert status_of(table, FIXTURE) == "improved"
    assert not table["status"].isin(regress.FAILING).any()


def test_factor_overrides_by_glob_and_bench_filter(tmp_path):
    table = compare_files(tmp_path, baseline_rows(fixture=0.010, ratio=1.0), baseline_rows(fixture=0.015, ratio=1.4),
                          overrides=[("fixture.*", 2.0)])
    assert status_of(table, FIXTURE) == "ok"
    assert status_of(table, DDP_RATIO) == "regression"
    assert regress.factor_for(FIXTURE, 1.25, [("fixture.*", 2.0), ("*loop", 3.0)]) == 3.0  # the last match wins
    only = compare_files(tmp_path, baseline_rows(fixture=0.010, ratio=1.0), baseline_rows(fixture=0.015, ratio=1.4),
                         bench=["^fixture"])
    assert list(only["benchmark"]) == [FIXTURE]


def test_a_benchmark_with_a_factor_of_its_own_keeps_it_unless_overridden():
    base = pd.DataFrame([{"benchmark": "runner.RunnerCost.track_runner_cost_per_step", "params": "", "value": 100.0,
                          "ci_low": float("nan"), "ci_high": float("nan"), "unit": "us", "type": "track",
                          "started_at": 0.0}])
    slower = base.assign(value=250.0)
    assert regress.compare(base, slower)["status"].tolist() == ["ok"]  # 2.5x, within its own 3x
    assert regress.compare(base, base.assign(value=320.0))["status"].tolist() == ["regression"]
    overridden = regress.compare(base, slower, overrides=[("runner.*", 2.0)])
    assert overridden["status"].tolist() == ["regression"] and overridden["factor"].tolist() == [2.0]


def test_main_exit_status_and_table(tmp_path, capsys):
    results = tmp_path / "results"
    base = write_results(results, "a" * 40, 1, baseline_rows(fixture=0.010))
    slow = write_results(results, "b" * 40, 2, baseline_rows(fixture=0.015))
    same = write_results(results, "c" * 40, 3, baseline_rows(fixture=0.0101))
    args = ["--results-dir", str(results)]
    assert regress.main([str(base), str(slow), *args]) == 1
    out = capsys.readouterr().out
    assert "regression" in out and FIXTURE in out and "1.500" in out and "10 ms" in out and "15 ms" in out
    assert "FAILED: 1 benchmark(s)" in out
    assert regress.main([str(base), str(same), *args]) == 0
    assert "FAILED" not in capsys.readouterr().out
    assert regress.main([str(base), str(slow), "--factor", "1.6", *args]) == 0
    assert regress.main([str(base), str(tmp_path / "none.json"), *args]) == 2
    assert "neither a results file nor a commit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        regress.main([str(base), str(slow), "--factor", "0.9"])


def test_human_units():
    assert regress.human(0.0123, "seconds") == "12.3 ms"
    assert regress.human(2.5e-6, "seconds") == "2.5 us"
    assert regress.human(546e6, "bytes") == "546 MB"
    assert regress.human(0.127, "x fp32") == "0.127 x fp32"
    assert regress.human(float("nan"), "seconds") == "-"


# -- the deliberate slowdown ------------------------------------------------------------------------------------

def load_fixture_module():
    """benchmarks/asv/fixture.py, with its package under a name of its own (asv imports the package as `asv`)."""
    name = "dtbench_asv_benchmarks"
    if name not in sys.modules:
        folder = ROOT / "benchmarks" / "asv"
        spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        saved = list(sys.path)
        spec.loader.exec_module(package)  # it puts the code root, tests/ and benchmarks/asv on sys.path
        importlib.import_module(f"{name}.fixture")
        sys.path[:] = saved
    return importlib.import_module(f"{name}.fixture")


def fixture_with(module, monkeypatch, slowdown: str | None):
    """The fixture benchmark, set up (as asv does) with DTBENCH_BENCH_SLOWDOWN as given (None: unset)."""
    if slowdown is None:
        monkeypatch.delenv("DTBENCH_BENCH_SLOWDOWN", raising=False)
    else:
        monkeypatch.setenv("DTBENCH_BENCH_SLOWDOWN", slowdown)
    bench = module.Fixture()
    bench.setup()
    return bench


def test_the_slowdown_switch_is_caught_by_the_check(tmp_path, monkeypatch):
    """The canary measured for real, off and on, then compared: the check must flag it.

    Only the ratio form is asserted live: on a shared VM the plain time of the same loop moves by up to 1.8x from
    one second to the next, so its 1.5x may honestly come out as noise (the synthetic tests above pin how time
    benchmarks are judged).
    """
    module = load_fixture_module()
    normal = fixture_with(module, monkeypatch, None).track_fixture_vs_reference()
    slowed = fixture_with(module, monkeypatch, "1.5").track_fixture_vs_reference()
    assert 0.8 < normal < 1.2 and 1.3 < slowed < 1.7, (normal, slowed)

    def rows(ratio: float) -> dict[str, list]:
        return {**baseline_rows(), FIXTURE_RATIO: track_row([ratio], [])}

    table = compare_files(tmp_path, rows(normal), rows(slowed))
    assert status_of(table, FIXTURE_RATIO) == "regression"
    assert list(table["status"][table["status"].isin(regress.FAILING)]) == ["regression"]


def test_the_slowdown_switch_scales_the_work_and_rejects_nonsense(monkeypatch):
    module = load_fixture_module()
    monkeypatch.setenv("DTBENCH_BENCH_SLOWDOWN", "1.5")
    bench = module.Fixture()
    bench.setup()
    assert bench.iterations == round(1.5 * module.ITERATIONS)
    for unset in ("", "1"):
        monkeypatch.setenv("DTBENCH_BENCH_SLOWDOWN", unset)
        bench.setup()
        assert bench.iterations == module.ITERATIONS
    monkeypatch.delenv("DTBENCH_BENCH_SLOWDOWN")
    bench.setup()
    assert bench.iterations == module.ITERATIONS
    for bad in ("fast", "0.5", "nan"):
        monkeypatch.setenv("DTBENCH_BENCH_SLOWDOWN", bad)
        with pytest.raises(ValueError, match="DTBENCH_BENCH_SLOWDOWN"):
            bench.setup()


# -- the summary --------------------------------------------------------------------------------------------------

def two_commits(tmp_path: Path) -> Path:
    """An older commit measured last (as `--compare` does), a newer one, and a stale second run of the newer one."""
    results = tmp_path / "results"
    newer = write_results(results, "b" * 40, 2_000_000_000_000, baseline_rows(fixture=0.012, ratio=1.10))
    stale = write_results(results, "b" * 40, 2_000_000_000_000, baseline_rows(fixture=0.5), env="other-env")
    older = write_results(results, "a" * 40, 1_000_000_000_000, baseline_rows(fixture=0.010, ratio=1.05))
    data = json.loads(stale.read_text())
    for row in data["results"].values():
        row[3] = 1  # started long ago: the other environment's run is older
    stale.write_text(json.dumps(data))
    older.touch()
    assert newer.exists()
    return results


def test_history_keeps_the_newest_run_per_commit_in_commit_order(tmp_path):
    history = summary.load_history(two_commits(tmp_path))
    assert summary.commits_in_order(history) == ["aaaaaaaa", "bbbbbbbb"]
    fixture = history[history["benchmark"] == FIXTURE].set_index("commit")["value"]
    assert fixture.to_dict() == pytest.approx({"aaaaaaaa": 0.010, "bbbbbbbb": 0.012})
    assert set(history["module"]) == {"fixture", "compressors", "runner"}
    latest = summary.latest_table(history).set_index(["benchmark", "params"])
    assert latest.loc[(FIXTURE, ""), "ratio"] == pytest.approx(1.2)
    assert latest.loc[(DDP_RATIO, ""), "previous"] == pytest.approx(1.05)


def test_write_summary_writes_offline_pages_and_plots(tmp_path):
    out = tmp_path / "summary"
    index = summary.write_summary(two_commits(tmp_path), out)
    text = index.read_text()
    assert "Latest: commit bbbbbbbb" in text and "aaaaaaaa, bbbbbbbb" in text
    assert f"| {FIXTURE} |  | 12 ms | 10 ms | 1.200 |" in text
    row = "| compressors.Roundtrip.time_roundtrip | compressor=onebit, numel=25000000 | 180 ms | 180 ms | 1.000 |"
    assert row in text
    for module in ("compressors", "fixture", "runner"):
        for kind in ("latest", "history"):
            png = out / f"{kind}_{module}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"]({png.name})" in text
    page = (out / "index.html").read_text()
    assert "<script" not in page and "http" not in page  # nothing to fetch: it renders offline
    assert page.count("data:image/png;base64,") == 6
    history = pd.read_csv(out / "history.csv")
    assert sorted(set(history["commit"])) == ["aaaaaaaa", "bbbbbbbb"]
    assert len(pd.read_csv(out / "latest.csv")) == len(history) // 2


def test_write_summary_without_results(tmp_path):
    index = summary.write_summary(tmp_path / "nothing", tmp_path / "summary")
    assert "No asv results yet" in index.read_text()
    assert not list((tmp_path / "summary").glob("*.png"))


def test_the_history_table_puts_each_benchmark_across_the_commits(tmp_path):
    results = two_commits(tmp_path)
    rows = baseline_rows(fixture=0.020, ratio=0.80)  # a third commit: the fixture 1.67x slower, the ratio better
    del rows[PAYLOAD]  # ... and one benchmark that did not run
    write_results(results, "c" * 40, 3_000_000_000_000, rows)
    history = summary.load_history(results)
    table = summary.history_table(history)
    assert list(table.columns) == ["benchmark", "params", "unit", "aaaaaaaa", "bbbbbbbb", "cccccccc"]
    fixture = table.set_index(["benchmark", "params"]).loc[(FIXTURE, "")]
    assert [fixture[c] for c in ("aaaaaaaa", "bbbbbbbb", "cccccccc")] == pytest.approx([0.010, 0.012, 0.020])
    payload = table[table["benchmark"] == PAYLOAD]
    assert len(payload) == 4 and payload["cccccccc"].isna().all() and payload["bbbbbbbb"].notna().all()
    assert list(table["benchmark"])[-4:] == [PAYLOAD] * 4  # rows of the newest commit first
    assert list(summary.history_table(history, commits=2).columns)[3:] == ["bbbbbbbb", "cccccccc"]

    page = summary.render_html(history, {}, "now")
    section = page[page.index("History, commit by commit"):]
    fixture_row = section[section.index(f"<td>{FIXTURE}</td>"):]
    fixture_row = fixture_row[:fixture_row.index("</tr>")]
    assert "<td class='num'>10 ms</td><td class='num'>12 ms</td><td class='num worse'>20 ms</td>" in fixture_row
    ratio_row = section[section.index(f"<td>{DDP_RATIO}</td>"):]
    assert "<td class='num better'>0.8 x torch DDP</td>" in ratio_row[:ratio_row.index("</tr>")]
    text = summary.render_markdown(history, [])
    assert "| aaaaaaaa (2001-09-09) | bbbbbbbb (2033-05-18) | cccccccc (2065-01-24) |" in text
    assert f"| {FIXTURE} |  | 10 ms | 12 ms | 20 ms |" in text
    assert "1.25x" in text


def test_a_change_is_marked_against_the_commit_before_beyond_the_factor():
    assert summary.change_class(0.0126, 0.010) == "worse" and summary.change_class(0.0125, 0.010) == ""
    assert summary.change_class(0.0079, 0.010) == "better" and summary.change_class(0.0081, 0.010) == ""
    assert summary.change_class(float("nan"), 0.010) == summary.change_class(0.010, float("nan")) == ""
    assert summary.change_class(0.5, 0.0) == "" and summary.change_class(3.0, 1.0, factor=2) == "worse"
