"""The allocator's peak (harness/memory/peak.py): exact bytes of known allocations, the window of steps, threads
that join and threads that do not, a run shorter than the window, and a real run's records."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from harness.memory.peak import AllocatorPeak, thread, window_peak

CPU = torch.device("cpu")
MB = 1 << 20


def _steps(meter: AllocatorPeak, transients: list[int]) -> None:
    """One step per entry: a transient of that many float32 elements."""
    for n in transients:
        meter.begin_step()
        t = torch.empty(n)
        del t
        meter.end_step()


def test_the_peak_is_what_was_built_plus_the_windows_largest_transient():
    meter = AllocatorPeak(CPU, first=2, steps=3)
    meter.start()
    weights = torch.empty(MB)  # 4 MiB built with the method: held throughout
    meter.pause()
    outside = torch.empty(8 * MB)  # the runner's own (a data order): not the method's
    _steps(meter, [16 * MB, MB, 2 * MB, MB, 32 * MB])  # step 1 and step 5 lie outside steps 2-4
    assert meter.peak == 4 * MB + 2 * MB * 4
    assert meter.measured == 3
    del weights, outside


def test_what_a_step_keeps_counts_in_the_later_steps():
    meter = AllocatorPeak(CPU, first=2, steps=2)
    meter.start()
    meter.pause()
    kept = []
    for _ in range(3):
        meter.begin_step()
        kept.append(torch.empty(MB))  # a stash the method keeps across steps
        meter.end_step()
    assert meter.peak == 3 * 4 * MB  # at the end of step 3, the window's last: the three stashes


def test_a_thread_that_joins_is_counted_and_one_that_does_not_is_not():
    def work(join: bool) -> None:
        def body():
            if join:
                with thread():
                    t = torch.empty(4 * MB)
                    del t
            else:
                t = torch.empty(4 * MB)
                del t
        worker = threading.Thread(target=body)
        worker.start()
        worker.join()

    for join, expected in ((True, 16 * MB), (False, 0)):
        meter = AllocatorPeak(CPU, first=1, steps=1)
        meter.start()
        meter.pause()
        meter.begin_step()
        work(join)
        meter.end_step()
        assert meter.peak == expected, join


def test_a_run_shorter_than_the_window_is_measured_on_its_steps():
    meter = AllocatorPeak(CPU, first=2, steps=3)
    meter.start()
    meter.pause()
    _steps(meter, [MB])
    assert meter.stop() == 4 * MB
    assert meter.measured == 1
    idle = AllocatorPeak(CPU)
    idle.start()
    assert idle.stop() is None and idle.measured == 0


def test_bad_windows_and_a_busy_profiler_are_refused():
    with pytest.raises(ValueError, match="first >= 1"):
        AllocatorPeak(CPU, first=0)
    with pytest.raises(ValueError, match="steps >= 1"):
        AllocatorPeak(CPU, steps=0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(RuntimeError, match="already on"):
            AllocatorPeak(CPU).start()
    assert window_peak([]) == 0


@pytest.mark.timeout(300)
def test_a_run_records_each_ranks_allocator_peak(tmp_path: Path):
    suite = tmp_path / "peak.toml"
    suite.write_text('name = "peak"\nworkload = "digits-mlp"\nseeds = [0]\nthreads_per_rank = 1\n'
                     "[budget]\nmax_steps = 5\n[defaults]\nbatch_size = 32\nlr = 0.05\nmomentum = 0.9\n"
                     '[[run]]\nmethod = "ddp"\nworld_size = 2\n')
    subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out", str(tmp_path), "--quiet"],
                   check=True, timeout=280)
    (run,) = (tmp_path / "peak").glob("ddp-*")
    final = json.loads((run / "status.json").read_text())["final"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (allocator,) = [r for r in records if r.get("kind") == "memory" and r.get("when") == "allocator"]
    peaks = {int(rank): value for rank, value in allocator["per_rank"].items()}
    assert set(peaks) == {0, 1} and allocator["steps"] == 3 and allocator["first_step"] == 2
    assert final["allocator_peak_bytes"] == max(peaks.values())
    (planned,) = [r for r in records if r.get("kind") == "memory" and r.get("when") == "planned"]
    weights = planned["per_rank"]["0"]["weights"]
    assert all(peak > 3 * weights for peak in peaks.values())  # weights, gradients and momentum at the least
