"""Fuzzing the run folders dtbench reads back (`report`, `claims`, `rerun`): garbage spec, status, manifest and
metrics files give exit 0 or 2 with one clear line, a corrupt metrics line loses only itself (and is counted), and
nothing is written outside the output folder."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
from _fuzz import FUZZ, OUT, check_outcome, cli, outside, sandbox, snapshot, written
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from test_fuzz_inputs import CLAIM, JUNK, NAMES, ROOT_TOKEN, place

from harness.cli import main
from harness.results import load_run

ROOT = Path(__file__).resolve().parents[2]
SUITE = (b'name = "t"\nworkload = "digits-mlp"\nseeds = [0, 1]\n[budget]\nmax_steps = 1\ntarget_accuracy = 0.5\n'
         b'[[run]]\nmethod = "sgd"\n[[run]]\nmethod = "gpipe"\nworld_size = 2\nparams = { microbatches = 2 }\n')


def _specs():
    import tempfile

    from harness.suite.expand import expand_suite

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "suite.toml"
        path.write_bytes(SUITE)
        return [spec.model_dump(mode="json") for spec in expand_suite(path)]


SPECS = _specs()
STATES = ["completed", "failed", "diverged", "preempted", "running", "", "weird"]


# --- files of a run folder ------------------------------------------------------------------------------------------

@st.composite
def json_file(draw, valid):
    """The bytes of a JSON file (None: the file is missing; "dir": a folder in its place): the valid document,
    the valid one with fields set to junk or deleted, another JSON value, or garbage bytes."""
    choice = draw(st.sampled_from(["valid"] * 4 + ["mutated"] * 4 + ["other", "garbage", "missing", "dir"]))
    if choice == "missing":
        return None
    if choice == "dir":
        return "dir"
    if choice == "garbage":
        return draw(st.sampled_from([b"", b"{", b"\xff\xfe", b"[" * 5000, b"NaN", b'{"a": 1}{'])) + draw(
            st.binary(max_size=8))
    doc = dict(draw(valid))
    if choice == "other":
        doc = draw(JUNK)
    elif choice == "mutated":
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from(sorted(doc) or ["x"]) if isinstance(doc, dict) else st.just("x"))
            if draw(st.booleans()):
                doc[key] = draw(st.one_of(JUNK, NAMES))
            else:
                doc.pop(key, None)
    return json.dumps(doc, allow_nan=True).replace(ROOT_TOKEN, "@").encode("utf-8", errors="surrogatepass")


def good_records(spec: dict, draw) -> list[dict]:
    """A plausible metrics.jsonl of the run: train records of every rank, rank 0's evals, a trace record per rank."""
    records = []
    world = spec.get("world_size") if isinstance(spec.get("world_size"), int) else 1
    for step in range(1, draw(st.integers(1, 3)) + 1):
        for rank in range(min(world, 2)):
            records.append({"kind": "train", "rank": rank, "wall_time_s": step, "train_time_s": step, "step": step,
                            "epoch": step / 4, "samples": 32 * step, "loss": draw(st.sampled_from([1.0, "nan"])),
                            "bytes_sent": 10 * step, "bytes_recv": 10 * step})
            records.append({"kind": "trace", "rank": rank, "wall_time_s": step, "train_time_s": step, "step": step,
                            "worker": rank, "events": [["forward", 0, 0.0, 0.1, 0, rank], ["backward", 0, 0.2, 0.3]]})
        records.append({"kind": "eval", "rank": 0, "wall_time_s": step, "train_time_s": step, "epoch": step / 4,
                        "samples": 32 * step, "test_accuracy": draw(st.floats(0, 1)), "test_loss": 1.0})
    return records


def _json_object(text: str) -> bool:
    """Whether a line is blank or a JSON object with a string kind (those are not surely corrupt)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return not text.strip()
    return isinstance(value, dict) and isinstance(value.get("kind"), str)


#: Lines that are corrupt whatever the rest of the file holds.
CORRUPT_LINES = st.one_of(
    st.sampled_from(["garbage", "{", '{"kind": "train", "rank": 0', "[1, 2]", "5", "null", '"text"', "[" * 3000,
                     '{"kind": 5}', '{"kind": ["eval"]}', '{"kind": "train", "rank": -1}',
                     '{"kind": "eval", "rank": {}}',
                     '{"kind": "eval", "test_accuracy": 2}', '{"kind": "eval", "test_accuracy": NaN}',
                     '{"kind": "train", "wall_time_s": Infinity}', '{"kind": "train", "bytes_sent": "many"}',
                     '{"kind": "train", "samples": 1e999}', '{"rank": 0}']),
    st.text(alphabet="{}[]\":,0123456789abc \t", min_size=1, max_size=20).filter(lambda t: not _json_object(t)),
)


@st.composite
def metrics_file(draw, spec):
    """metrics.jsonl as (bytes, good lines, corrupt lines), or (None, 0, 0) for a missing file. Each line is a
    good record, a good record with a field set to junk (counted as neither), a truncated good record or a corrupt
    line; blank lines too."""
    if draw(st.integers(0, 9)) == 0:
        return None, 0, 0
    lines, good, bad = [], 0, 0
    for record in good_records(spec, draw):
        choice = draw(st.sampled_from(["good"] * 6 + ["truncated", "corrupt", "junk field", "blank"]))
        text = json.dumps(record)
        if choice == "good":
            lines.append(text)
            good += 1
        elif choice == "truncated":
            lines.append(text[:draw(st.integers(1, len(text) - 1))])
            bad += 1
        elif choice == "corrupt":
            lines.append(draw(CORRUPT_LINES))
            bad += 1
        elif choice == "junk field":
            record[draw(st.sampled_from(sorted(record)))] = draw(JUNK)
            lines.append(json.dumps(record, allow_nan=True))
            good = bad = math.nan  # either may hold now
        else:
            lines.append(" ")
    return ("\n".join(lines) + draw(st.sampled_from(["\n", ""]))).encode("utf-8", errors="surrogatepass"), good, bad


@st.composite
def suite_folders(draw):
    """A suite results folder: up to three run folders of fuzzed files, now and then stray files and empty
    folders, as {relative path: bytes or "dir"}."""
    files: dict[str, object] = {}
    for i in range(draw(st.integers(0, 3))):
        spec = draw(st.sampled_from(SPECS))
        run = f"run{i}"
        files[run] = "dir"
        for name, valid in (("spec.json", st.just(spec)),
                            ("status.json", st.builds(lambda s: {"state": s, "error": None}, st.sampled_from(STATES))),
                            ("manifest.json", st.just({"hostname": "h", "argv": ["dtbench"]}))):
            data = draw(json_file(valid))
            if data is not None:
                files[f"{run}/{name}"] = data
        data, _, _ = draw(metrics_file(spec))
        if data is not None:
            files[f"{run}/metrics.jsonl"] = data
    for stray in draw(st.lists(st.sampled_from(["empty", "notes.txt", "report", "report/old.png"]), max_size=2)):
        files.setdefault(stray, "dir" if stray == "empty" else b"x")
    return files


def build(root, files: dict[str, object]):
    suite_dir = root / "results" / "t"
    suite_dir.mkdir(parents=True)
    for rel, data in sorted(files.items()):
        path = suite_dir / rel
        try:  # a path below a file ("report" a file, then "report/old.png") is left out
            if data == "dir":
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            pass
    return suite_dir


# --- report, claims ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@settings(FUZZ, max_examples=20)
@given(suite_folders())
@example({"run0": "dir", "run0/spec.json": json.dumps({**SPECS[0], "budget": 5}).encode()})
@example({"run0": "dir", "run0/spec.json": json.dumps({**SPECS[0], "budget": {"target_accuracy": "x"}}).encode(),
          "run0/metrics.jsonl": b'{"kind": "eval", "rank": 0, "test_accuracy": 0.5, "train_time_s": 1}\n'})
@example({"run0": "dir", "run0/spec.json": json.dumps({**SPECS[0], "suite_file": "/" * 5000}).encode()})
@example({"run0": "dir", "run0/spec.json": json.dumps(SPECS[0]).encode(), "report": b"a file"})
@example({"run0": "dir", "run0/spec.json": json.dumps({**SPECS[0], "seed": {}}).encode()})
def test_report_on_fuzzed_run_folders(files):
    with sandbox() as root:
        suite_dir = build(root, files)
        before = snapshot(root)
        code, out, err = cli(["report", str(suite_dir)], root)
        event(f"exit {code}")
        check_outcome(code, err, names=str(root))  # the error names the folder or the file
        assert code in (0, 2)
        assert outside(written(before, snapshot(root)), "results/t/report") == []


@pytest.mark.slow
@settings(FUZZ, max_examples=150)
@given(suite_folders())
@example({"run0": "dir", "run0/spec.json": json.dumps({**SPECS[0], "seed": {}}).encode()})
@example({"run0": "dir", "run0/spec.json": json.dumps({**SPECS[0], "budget": [1]}).encode()})
def test_claims_on_fuzzed_run_folders(files):
    with sandbox() as root:
        suite_dir = build(root, files)
        claims = place(root, ("[[claim]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in {
            **CLAIM, "method": "gpipe", "baseline": "sgd"}.items())).encode(), "c.claims.toml")
        before = snapshot(root)
        code, out, err = cli(["claims", str(suite_dir), str(claims), "--out", "out"], root)
        event(f"exit {code}")
        check_outcome(code, err, names=str(root))
        assert outside(written(before, snapshot(root)), OUT) == []


# --- a corrupt line loses only itself -----------------------------------------------------------------------------

@settings(FUZZ, max_examples=150)
@given(st.data())
def test_a_corrupt_metrics_line_loses_only_itself(data):
    spec = data.draw(st.sampled_from(SPECS))
    blob, good, bad = data.draw(metrics_file(spec))
    with sandbox() as root:
        run = root / "run"
        run.mkdir()
        (run / "spec.json").write_text(json.dumps(spec))
        if blob is not None:
            (run / "metrics.jsonl").write_bytes(blob)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = load_run(run)
        skipped = [w for w in caught if "skipped a corrupt line" in str(w.message)]
        assert result.dropped_lines == len(skipped)
        if not math.isnan(good):
            assert len(result.metrics) == good
            assert result.dropped_lines == bad


# --- rerun ----------------------------------------------------------------------------------------------------------

@settings(FUZZ, max_examples=150)
@given(json_file(st.sampled_from(SPECS)))
@example(json.dumps({**SPECS[0], "run_id": "@ROOT@/escaped"}).encode())
@example(json.dumps({**SPECS[0], "suite": "../../escaped"}).encode())
@example(json.dumps({**SPECS[0], "run_id": "a\u0000b"}).encode())
@example(json.dumps({**SPECS[0], "world_size": 0}).encode())
@example(json.dumps({**SPECS[0], "method": "nope"}).encode())
@example(json.dumps({**SPECS[0], "seed": -1}).encode())
@example(b"\xff\xfe")
def test_rerun_on_fuzzed_spec_files(data):
    with sandbox() as root:
        run = root / "in" / "run"
        run.mkdir(parents=True)
        if data == "dir":
            (run / "spec.json").mkdir()
        elif data is not None:
            (run / "spec.json").write_bytes(data.replace(b"@ROOT@", str(root).encode()))
        before = snapshot(root)
        code, out, err = cli(["rerun", str(run), "--out", "out", "--quiet"], root)  # a launcher that runs nothing
        event(f"exit {code}")
        check_outcome(code, err, names=str(run / "spec.json"))
        assert code in (0, 2)
        assert outside(written(before, snapshot(root)), OUT) == []
        if code == 0:  # what rerun accepts is a run a suite could have made
            spec = json.loads(data)
            assert (root / OUT / spec["suite"] / spec["run_id"] / "status.json").is_file()
            _check_runnable(spec)


def _check_runnable(spec: dict) -> None:
    from harness import registry

    method = registry.METHODS.get(spec["method"])
    registry.WORKLOADS.get(spec["workload"])
    assert spec["world_size"] >= 1 and 0 <= spec["seed"] < 2**32
    assert method.check_world_size(spec["world_size"], method.Params.from_spec(spec["params"])) is None


# --- extreme values: every number the report and the claims derive -----------------------------------------------

EXTREMES = (math.inf, -math.inf, math.nan, 1e308, -1e308)
THREE_SEEDS = (b'name = "t"\nworkload = "digits-mlp"\nseeds = [0, 1, 2]\n[budget]\nmax_steps = 4\n'
               b'target_accuracy = 0.6\n[[run]]\nmethod = "sgd"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n')
#: Every input of the summary's numbers: (where, field). `final` is status.json's final, `spec` spec.json.
SUMMARY_INPUTS = [
    *[("train", f) for f in ("step", "epoch", "samples", "loss", "bytes_sent", "bytes_recv", "train_time_s",
                             "wall_time_s")],
    *[("eval", f) for f in ("test_loss", "test_accuracy", "train_time_s", "samples", "epoch")],
    *[("cpu", f) for f in ("cpu_s", "wait_s", "wall_s", "threads", "machine_busy_s", "machine_steal_s", "cores",
                           "peak_rss_bytes")],
    ("final", "planned_memory_bytes"), ("final", "held_memory_bytes"), ("spec", "memory_per_rank"),
]
CLAIM_METRICS = ("time_to_target_s", "final_accuracy", "train_time_s", "total_bytes", "bytes_per_sample",
                 "perplexity", "samples_per_s", "peak_rss_bytes", "planned_memory_bytes")


def _three_seed_specs() -> list[dict]:
    import tempfile

    from harness.suite.expand import expand_suite

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "suite.toml"
        path.write_bytes(THREE_SEEDS)
        return [spec.model_dump(mode="json") for spec in expand_suite(path)]


def made_suite(root: Path, edit=None, specs=None) -> Path:
    """A suite folder written by hand as runs write it (sgd and ddp on 2 ranks, seeds 0-2: train, eval and cpu
    records, a status with its final), `edit(i, spec, status, records)` changing run i's before they are written."""
    suite_dir = root / "results" / "t"
    for i, spec in enumerate(specs or _three_seed_specs()):
        status = {"state": "completed", "error": None,
                  "final": {"planned_memory_bytes": 1000, "held_memory_bytes": 900}}
        records = []
        for step in range(1, 5):
            for rank in range(spec["world_size"]):
                records.append({"kind": "train", "rank": rank, "wall_time_s": step, "train_time_s": step,
                                "step": step, "epoch": step / 10, "samples": 32 * step, "loss": 1 / step,
                                "bytes_sent": 100 * step, "bytes_recv": 100 * step})
            records.append({"kind": "eval", "rank": 0, "wall_time_s": step, "train_time_s": step, "epoch": step / 10,
                            "samples": 32 * step, "test_accuracy": 0.5 + 0.1 * step - 0.01 * i, "test_loss": 1 / step})
        for rank in range(spec["world_size"]):
            records.append({"kind": "cpu", "rank": rank, "wall_time_s": 5, "train_time_s": 4, "host": "h",
                            "cpu_s": 3.0, "wait_s": 0.5, "wall_s": 5.0, "threads": 1, "machine_busy_s": 8.0,
                            "machine_steal_s": 0.0, "cores": 2, "peak_rss_bytes": 1e8})
        spec = dict(spec)
        if edit is not None:
            edit(i, spec, status, records)
        run = suite_dir / spec["run_id"]
        run.mkdir(parents=True)
        (run / "spec.json").write_text(json.dumps(spec))
        (run / "status.json").write_text(json.dumps(status))
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return suite_dir


def extreme(where: str, field: str, values) -> object:
    """An edit for made_suite: run i's `field` of `where` (every record of that kind, status.json's final, or
    spec.json) set to values[i % len(values)]."""
    def edit(i, spec, status, records):
        value = values[i % len(values)]
        if where == "spec":
            spec[field] = value
        elif where == "final":
            status["final"][field] = value
        for record in records:
            if record["kind"] == where:
                record[field] = value
    return edit


def claims_file(root: Path) -> Path:
    claims = [{**CLAIM, "id": f"c{i}", "metric": metric, "method": "sgd x1", "baseline": "ddp",
               "relation": "ratio_le" if i % 2 else "diff_ge", "value": 2.0 if i % 2 else -0.5}
              for i, metric in enumerate(CLAIM_METRICS)]
    text = "".join("[[claim]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in claim.items()) for claim in claims)
    return place(root, text.encode(), "c.claims.toml")


def report_and_judge(root: Path, suite_dir: Path) -> tuple[str, str]:
    """`dtbench report` and `dtbench claims` on the folder: each exits 0 (claims: 0 or 1, a FAIL) with its CSVs,
    and no warning about arithmetic (an overflow is inf, a NaN a blank, never a warning or a crash)."""
    code, out, err = cli(["report", str(suite_dir)], root)
    check_outcome(code, err)
    assert code == 0, err
    code, out, claims_err = cli(["claims", str(suite_dir), str(claims_file(root)), "--out", "out"], root)
    check_outcome(code, claims_err)
    assert code in (0, 1), claims_err
    for text in (err, claims_err):  # the only warnings: the records the reader skipped (not finite, out of range),
        # and runs whose cpu records say starved (a 1e308 wait_s does)
        assert all("corrupt" in line or "starved of CPU" in line for line in text.splitlines()), text
    for name in ("summary.csv", "rankings.csv", "comparisons.csv"):
        assert (suite_dir / "report" / name).is_file()
    assert (root / OUT / "claims.csv").is_file()
    return err, claims_err


@pytest.mark.parametrize("where,field", SUMMARY_INPUTS, ids=[f"{w}.{f}" for w, f in SUMMARY_INPUTS])
def test_every_summary_input_at_inf_nan_and_1e308_reports_and_judges(where, field):
    """Each input of the summary at inf, -inf, NaN, 1e308 and -1e308 (a value on each run, so the 1e308s of two
    ddp runs overflow a mean and its two ranks a sum): the report, its CSVs and the claims are written. The plots
    are left out here (they take seconds a folder); the next test draws them over the curves' inputs."""
    with sandbox() as root:
        suite_dir = made_suite(root, extreme(where, field, EXTREMES))
        with mock.patch("harness.report.build.plots_module.suite_plots", lambda *args, **kwargs: []):
            report_and_judge(root, suite_dir)
        table = pd.read_csv(suite_dir / "report" / "summary.csv")
        for column in ("final_accuracy", "train_time_s", "bytes_per_sample", "perplexity", "samples_per_s"):
            assert table[column].dtype == float, column


def test_the_plots_survive_curves_at_1e308_and_inf():
    """The curves' inputs at 1e308 and inf on different runs (train loss, the evals' times, epochs and loss, the
    train records' times): every plot is drawn, those points left out (before: 'arange: cannot compute length',
    exit 2 and no page)."""
    fields = [("train", "loss"), ("eval", "train_time_s"), ("eval", "epoch"), ("train", "train_time_s"),
              ("eval", "test_loss"), ("train", "samples")]

    def edit(i, spec, status, records):
        extreme(*fields[i], (1e308,))(i, spec, status, records)
        extreme(*fields[(i + 1) % len(fields)], (math.inf,))(i, spec, status, records)

    with sandbox() as root:
        suite_dir = made_suite(root, edit)
        report_and_judge(root, suite_dir)
        assert (suite_dir / "report" / "loss_vs_time.png").is_file()


def test_a_diverged_run_at_a_large_finite_loss_reports_and_is_judged():
    """sgd at lr 80 on digits-mlp diverges with a large but finite loss: exp of it overflowed, and `dtbench report`
    and `dtbench claims` stopped with OverflowError (nothing written). Now its perplexity is inf and both run."""
    def edit(i, spec, status, records):
        if i == 0:
            status["state"] = "diverged"
            status["error"] = {"message": "non-finite loss at step 4", "rank": 0}
            for record in records:
                if record["kind"] == "train":
                    record["loss"] = 4.7e3
                elif record["kind"] == "eval":
                    record.update(test_loss=4.7e3, test_accuracy=0.1)

    with sandbox() as root:
        suite_dir = made_suite(root, edit)
        report_and_judge(root, suite_dir)
        with (suite_dir / "report" / "summary.csv").open(newline="") as f:
            rows = {row["run_id"]: row for row in csv.DictReader(f)}
        diverged = rows["sgd-digits-mlp-w1-s0"]
        assert diverged["state"] == "diverged" and diverged["final_loss"] == "4700.0"
        assert diverged["perplexity"] == "inf"
        verdicts = pd.read_csv(root / OUT / "claims.csv")
        assert len(verdicts) == len(CLAIM_METRICS)


def test_a_byte_count_beyond_a_counter_is_a_blank_not_a_crash():
    """Two ranks' bytes_sent of 1e308 sum to inf: total_bytes (a count) is empty, the bytes per sample inf."""
    with sandbox() as root:
        suite_dir = made_suite(root, extreme("train", "bytes_sent", (1e308,)))
        with mock.patch("harness.report.build.plots_module.suite_plots", lambda *args, **kwargs: []):
            report_and_judge(root, suite_dir)
        table = pd.read_csv(suite_dir / "report" / "summary.csv").set_index("run_id")
        assert pd.isna(table.loc["ddp-digits-mlp-w2-s0", "total_bytes"])
        assert table.loc["ddp-digits-mlp-w2-s0", "bytes_per_sample"] == math.inf
        assert pd.isna(table.loc["sgd-digits-mlp-w1-s0", "total_bytes"])  # 1e308 itself: beyond 2**63
        assert table.loc["sgd-digits-mlp-w1-s0", "bytes_per_sample"] == pytest.approx(1e308 / 128)


# --- real runs (one step each), end to end --------------------------------------------------------------------------

@pytest.mark.slow
def test_a_real_run_then_report_counts_a_corrupt_line(tmp_path):
    """A 1-step sgd run for real, a garbage line and a truncated one appended to its metrics.jsonl: the report keeps
    every other record and says it skipped two lines; a rerun of the folder runs it again."""
    suite = tmp_path / "one.toml"
    suite.write_text('name = "one"\nworkload = "digits-mlp"\n[budget]\nmax_steps = 1\n'
                     '[[run]]\nmethod = "sgd"\nthreads_per_rank = 1\n')
    assert main(["run", str(suite), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    run = tmp_path / "out" / "one" / "sgd-digits-mlp-w1-s0"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    with (run / "metrics.jsonl").open("a") as f:
        f.write("garbage\n" + lines[-1][:10] + "\n")
    # the command line itself (not main in-process): each warning one `dtbench: warning:` line, no source lines
    done = subprocess.run([sys.executable, "-m", "harness.cli", "report", str(tmp_path / "out" / "one")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "skipped 2 corrupt lines of metrics.jsonl in 1 run (sgd-digits-mlp-w1-s0: 2)" in done.stderr
    assert all(line.startswith("dtbench: warning: ") for line in done.stderr.splitlines()), done.stderr
    assert len(done.stderr.splitlines()) == 3  # line 7, line 8, and the count
    assert "Corrupt records." in (tmp_path / "out" / "one" / "report" / "index.html").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(load_run(run).metrics) == len(lines)
    assert main(["rerun", str(run), "--out", str(tmp_path / "again"), "--quiet"]) == 0
    assert (tmp_path / "again" / "one" / "sgd-digits-mlp-w1-s0" / "status.json").is_file()
