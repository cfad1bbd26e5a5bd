"""Network emulation: the --network syntax, suite and run-id plumbing, the non-root error, and (as root) the real
namespaces: a calibrated 100 Mbit all_reduce, the relay's latency, and teardown after a killed rank or launcher."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.net import emulation, namespaces
from harness.net.check import point_to_point_seconds, ring_all_reduce_seconds
from harness.net.emulation import requirements_problem
from harness.net.spec import NetworkSpec, parse_latency, parse_network, parse_rate
from harness.report import network as report_network
from harness.suite.expand import expand_suite
from harness.suite.files import FileError
from harness.suite.spec import make_run_id

ROOT = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
root_only = pytest.mark.skipif(not IS_ROOT, reason="needs root and iproute2 (network namespaces)")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}

SUITE = """
name = "n"
workload = "digits-mlp"
threads_per_rank = 1
[budget]
max_epochs = 1
eval_every_epochs = 1
[[run]]
method = "ddp"
world_size = 2
"""


def write(tmp_path: Path, text: str, name: str = "suite.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def leftovers(pid: int) -> list[str]:
    """Namespaces and root links that the launcher with this pid made and that still exist."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [n for n in namespaces.list_netns() if n.startswith(f"dtb-{pid}-")] + [
        line.split(":")[1].strip() for line in links.splitlines() if f" dtb{pid}n" in line]


# ------------------------------------------------------------------------------------------------ syntax


def test_rates_and_latencies_parse_in_tc_units():
    assert parse_rate("100mbit") == 100_000_000 and parse_rate("1GBit") == 10**9 and parse_rate("2.5kbit") == 2500
    assert parse_rate("unlimited") is None
    assert parse_latency("1ms") == pytest.approx(1e-3) and parse_latency("500us") == pytest.approx(5e-4)
    assert parse_latency("0") == 0
    for bad in ("100", "100mb", "fast", "-1mbit", "0mbit"):
        with pytest.raises(ValueError, match="rate"):
            parse_rate(bad)
    with pytest.raises(ValueError, match="latency"):
        parse_latency("1 minute")


def test_network_text_form_round_trips():
    spec = parse_network("100Mbit, latency=1ms")
    assert (spec.rate, spec.latency, spec.rate_bps, spec.latency_s) == ("100mbit", "1ms", 10**8, pytest.approx(1e-3))
    assert spec.text == "100mbit,latency=1ms" and parse_network(spec.text) == spec
    assert parse_network("unlimited").text == "unlimited" and parse_network("1gbit,latency=0").latency is None
    assert NetworkSpec.model_validate("1gbit") == NetworkSpec(rate="1gbit")
    for bad, words in (("100mbit,delay=1ms", "unknown option 'delay=1ms'"), ("100mbit,latency=fast", "latency"),
                       ("quick", "rate")):
        with pytest.raises(ValueError, match=words):
            parse_network(bad)


def test_ring_model():
    mib10 = 10 * 2**20
    assert ring_all_reduce_seconds(mib10, 2, 10**8) == pytest.approx(mib10 * 8 / 1e8)
    assert ring_all_reduce_seconds(mib10, 4, 10**8, 1e-3) == pytest.approx(1.5 * mib10 * 8 / 1e8 + 6e-3)
    assert ring_all_reduce_seconds(mib10, 1, 10**8) == 0
    assert point_to_point_seconds(mib10, 10**9, 1e-3) == pytest.approx(mib10 * 8 / 1e9 + 2e-3)
    assert ring_all_reduce_seconds(mib10, 2, None) != ring_all_reduce_seconds(mib10, 2, None)  # NaN: no model


# ------------------------------------------------------------------------------------------- suite files


def test_suite_network_reaches_specs_ids_and_labels(tmp_path):
    plain = expand_suite(write(tmp_path, SUITE))[0]
    assert plain.run_id == "ddp-digits-mlp-w2-s0" and plain.network is None and plain.label == "ddp x2"
    suite_wide = expand_suite(write(tmp_path, SUITE.replace("[budget]", '[network]\nrate = "100mbit"\n[budget]')))[0]
    assert suite_wide.run_id == "ddp-digits-mlp-w2-net100mbit-s0"
    assert suite_wide.network == NetworkSpec(rate="100mbit") and suite_wide.label == "ddp x2 @ 100mbit"
    per_run = SUITE + 'network = "1gbit,latency=1ms"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n'
    specs = expand_suite(write(tmp_path, per_run))
    assert [s.run_id for s in specs] == ["ddp-digits-mlp-w2-net1gbit-lat1ms-s0", "ddp-digits-mlp-w2-s0"]
    assert json.loads(specs[0].model_dump_json())["network"] == {"rate": "1gbit", "latency": "1ms"}


def test_cli_network_replaces_every_run_network_and_duplicates_are_named(tmp_path):
    per_run = SUITE + 'network = "1gbit"\n[[run]]\nmethod = "ddp"\nworld_size = 2\n'
    with pytest.raises(FileError, match=r"run\[1\]: duplicates run\[0\] .*network"):
        expand_suite(write(tmp_path, per_run), network=parse_network("unlimited"))
    spec = expand_suite(write(tmp_path, SUITE), network=parse_network("unlimited"))[0]
    assert spec.run_id == "ddp-digits-mlp-w2-netunlimited-s0"


def test_run_ids_without_a_network_are_unchanged():
    # Pinned: ids of existing results must not move (also those that carry a digest).
    assert make_run_id("qsgd", "digits-mlp", 2, {"bits": 4}, 0) == "qsgd-digits-mlp-w2-bits4-s0"
    assert make_run_id("x", "digits-mlp", 2, {"a": "b c"}, 1) == "x-digits-mlp-w2-ab_c-s1-921c91bb"
    assert make_run_id("x", "digits-mlp", 2, {"a": "b c"}, 1, network=NetworkSpec(rate="1gbit")) != \
        make_run_id("x", "digits-mlp", 2, {"a": "b c"}, 1)


@pytest.mark.parametrize(("snippet", "field"), [
    ('[network]\nrate = "fast"\n', "network.rate"),
    ('[network]\nrate = "1gbit"\ndelay = "1ms"\n', "network.delay: unknown key"),
    ('[network]\nrate = "1gbit"\nlatency = "soon"\n', "network.latency"),
])
def test_bad_network_in_a_suite_names_file_and_field(tmp_path, snippet, field):
    path = write(tmp_path, SUITE.replace("[budget]", snippet + "[budget]"))
    with pytest.raises(FileError) as err:
        expand_suite(path)
    assert str(err.value).startswith(f"{path}: {field}") and "\n" not in str(err.value)


def test_bad_run_network_and_bad_cli_network_exit_2_writing_nothing(tmp_path, capsys):
    from harness.cli import main

    path = write(tmp_path, SUITE + 'network = "100mbit,latency=1 ms"\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dtbench: error: {path}: run[0].network") and "\n" not in err
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(write(tmp_path, SUITE)), "--out", str(tmp_path / "out"), "--network", "100mbps"])
    assert exit_.value.code == 2 and "argument --network: network '100mbps': rate" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_net_check_help_and_bad_options(capsys):
    from harness.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["net-check", "--help"])
    assert exit_.value.code == 0 and "2(W-1)/W·size/B + 2(W-1)·latency" in " ".join(capsys.readouterr().out.split())
    assert main(["net-check", "--network", "100mbit", "--world-size", "1"]) == 2
    assert capsys.readouterr().err.strip() == "dtbench: error: net-check: --world-size must be at least 2"


def test_requirements_name_what_is_missing(monkeypatch, tmp_path):
    spec = NetworkSpec(rate="1gbit")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in requirements_problem(spec)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path))  # no ip, no tc
    problem = requirements_problem(spec)
    assert "needs iproute2 (ip and tc not found on PATH)" in problem and "\n" not in problem


#: Runs the CLI as the unprivileged user nobody: the interpreter starts as root (its files are under /root here) and
#: imports what the CLI needs, then drops to uid/gid 65534 with no groups (and so no capabilities) before main().
AS_NOBODY = ("import sys, os, harness.cli, harness.launch.suite, harness.net.check, harness.registry\n"
             "import harness.suite.expand\n"
             "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n"
             "assert os.geteuid() == 65534\n"
             "sys.exit(harness.cli.main(sys.argv[1:]))")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody")
def test_without_root_run_and_net_check_stop_with_one_clear_line(tmp_path):
    """A real unprivileged process (uid nobody): exit 2, one line saying root is needed, nothing written."""
    shared = Path(f"/tmp/dtbench-nonroot-{os.getpid()}")
    shared.mkdir(mode=0o755)
    try:
        suite = write(shared, SUITE)
        suite.chmod(0o644)
        out = shared / "out"
        for args in (["run", str(suite), "--out", str(out), "--network", "100mbit"],
                     ["net-check", "--network", "100mbit"]):
            done = subprocess.run([sys.executable, "-c", AS_NOBODY, *args],
                                  env={**ENV, "HOME": str(shared)}, capture_output=True, text=True, timeout=120,
                                  cwd=shared)
            assert done.returncode == 2, done.stderr
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("dtbench: error: network emulation needs root"), lines
        assert not out.exists()
    finally:
        shutil.rmtree(shared)


# ---------------------------------------------------------------------------------------------- the report


def test_report_facets_by_network():
    table = pd.DataFrame({
        "label": ["ddp x2 @ 100mbit", "qsgd x2 @ 100mbit", "ddp x2 @ unlimited", "qsgd x2 @ unlimited",
                  "qsgd x2 @ 1gbit", "ddp x2 @ 1gbit"],
        "method": ["ddp", "qsgd", "ddp", "qsgd", "qsgd", "ddp"],
        "network": ["100mbit", "100mbit", "unlimited", "unlimited", "1gbit", "1gbit"],
        "samples_per_s": [100.0, 400.0, 2000.0, 1000.0, 800.0, 800.0],
        "time_to_target_s": [20.0, 5.0, 1.0, float("nan"), 2.0, 2.5],
    })
    assert report_network.network_order(["unlimited", "1gbit", "", "100mbit,latency=1ms", "100mbit"]) == [
        "100mbit,latency=1ms", "100mbit", "1gbit", "unlimited", ""]
    speedups = report_network.network_speedup(table, "ddp x2")
    assert list(speedups["method_label"]) == ["ddp x2"] * 3 + ["qsgd x2"] * 3
    assert list(speedups["network"]) == ["100mbit", "1gbit", "unlimited"] * 2
    qsgd = speedups[speedups["method_label"] == "qsgd x2"].set_index("network")
    assert qsgd["throughput_speedup"].tolist() == [4.0, 1.0, 0.5] and qsgd.loc["100mbit", "time_speedup"] == 4.0
    assert report_network.crossover_lines(speedups) == [
        "qsgd x2: faster at 100mbit; not at 1gbit, unlimited; crossover (interpolated in 1/rate): throughput at "
        "about 1000 Mbit/s"]
    fig = report_network.plot_network_crossover(speedups, "ddp x2")
    assert [ax.get_xticklabels()[0].get_text() for ax in fig.axes] == ["100mbit"] * 3
    assert "By network" in report_network.network_html(speedups, "ddp x2")


def test_crossover_rate_intersects_times_linear_in_one_over_rate():
    # Baseline: 1 ms + 1e6 bit / rate per sample; method: 3 ms + 1e5 bit / rate. Equal at 1e6 - 1e5 = 2e-3 * rate.
    rates = [1e8, 3e8, 1e9]

    def times(fixed, bits):
        return [fixed + bits / r for r in rates]

    assert report_network.crossover_rate(rates, times(1e-3, 1e6), times(3e-3, 1e5)) == pytest.approx(4.5e8)
    assert math.isnan(report_network.crossover_rate(rates, times(1e-3, 1e6), times(1e-3, 1e5)))  # always faster
    assert math.isnan(report_network.crossover_rate(rates[:1], times(1e-3, 1e6)[:1], times(3e-3, 1e5)[:1]))


# ------------------------------------------------------------------------------------- real namespaces (root)


@root_only
def test_stale_namespaces_of_a_dead_launcher_are_swept():
    dead = 4_000_000  # above pid_max: no such process
    names = [f"dtb-{dead}-0-hub", f"dtb-{dead}-0-r0"]
    for name in names:
        subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "link", "add", f"dtb{dead}n0", "type", "veth", "peer", "name", "uplink", "netns", names[0]],
                   check=True)
    removed = namespaces.sweep_stale()
    assert set(names) <= set(removed) and not leftovers(dead)


@root_only
@pytest.mark.slow
def test_all_reduce_of_10mb_at_100mbit_matches_the_ring_model():
    from harness.net.check import measure

    before = namespaces.list_netns()
    checks = measure(parse_network("100mbit"), world_size=2, size_bytes=10 * 2**20, repeats=2)
    all_reduce = checks[1]
    assert all_reduce.model_s == pytest.approx(10 * 2**20 * 8 / 1e8)
    assert all_reduce.within(0.25), f"all_reduce {all_reduce.measured_s:.3f} s vs ring model {all_reduce.model_s:.3f} s"
    assert checks[0].within(0.25)
    assert namespaces.list_netns() == before and not leftovers(os.getpid())


@root_only
@pytest.mark.slow
def test_relay_adds_the_latency_between_ranks():
    """A TCP connect from rank 0 to a closed port of rank 1 takes one round trip: 2 x latency."""
    probe = textwrap.dedent("""
        import socket, time
        best = 9.0
        for _ in range(5):
            s = socket.socket()
            t = time.perf_counter()
            try:
                s.connect(("{addr}", 9))
            except ConnectionRefusedError:
                pass
            best = min(best, time.perf_counter() - t)
            s.close()
        print(best)""")
    with emulation.emulated_network(parse_network("unlimited,latency=20ms"), 2) as topo:
        done = subprocess.run(["ip", "netns", "exec", topo.ranks[0], sys.executable, "-c",
                               probe.format(addr=topo.rank_addr(1))], capture_output=True, text=True, timeout=60)
        store = subprocess.run(["ip", "netns", "exec", topo.ranks[0], sys.executable, "-c",
                                probe.format(addr=topo.store_addr)], capture_output=True, text=True, timeout=60)
        assert topo.relay is not None and topo.relay.packets > 0
    assert 0.040 <= float(done.stdout) < 0.060, done.stderr
    assert 0.020 <= float(store.stdout) < 0.035, store.stderr  # the store is one link (latency/2 each way) away
    assert not leftovers(os.getpid())


@root_only
@pytest.mark.slow
def test_no_namespace_is_left_after_a_killed_rank_or_a_terminated_launcher(tmp_path):
    path = write(tmp_path, SUITE.replace("max_epochs = 1", "max_epochs = 2000").replace(
        "[budget]", '[network]\nrate = "1gbit"\n[budget]'))
    out = tmp_path / "out"
    run_dir = out / "n" / "ddp-digits-mlp-w2-net1gbit-s0"

    def start_and_wait_for_training() -> tuple[subprocess.Popen, dict]:
        shutil.rmtree(out, ignore_errors=True)  # no earlier attempt's files to mistake for this one's
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(out), "--quiet"],
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists() and '"rank": 1' in metrics.read_text():
                return proc, json.loads((run_dir / "status.json").read_text())["pids"]
            time.sleep(0.2)
        proc.kill()
        pytest.fail("the networked run never started training")

    proc, pids = start_and_wait_for_training()
    assert leftovers(proc.pid), "the run should be inside its namespaces"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["network"]["rate"] == "1gbit" and manifest["network"]["namespaces"] == [
        f"dtb-{proc.pid}-0-r0", f"dtb-{proc.pid}-0-r1"]
    os.kill(pids["1"], signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["error"]["rank"] == 1
    assert not leftovers(proc.pid)

    proc, _ = start_and_wait_for_training()  # SIGTERM to the launcher (kill, timeout): torn down like Ctrl-C
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130 and not leftovers(proc.pid)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"
