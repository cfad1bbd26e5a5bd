"""Run a command while busy processes load the machine's cores, as a user's laptop or a shared CI machine is loaded.

    python benchmarks/checks/load.py [--workers 2] [--seconds S] [-- COMMAND ...]

Starts `--workers` processes that each spin a Python loop (each a whole core; threads would share one interpreter
lock and load one core at most), runs COMMAND, stops them and prints the command's wall time, its exit status and
the 1-minute load average seen while it ran. Without COMMAND it loads the machine for `--seconds` (default 60).
Exits with the command's exit status. Example: `python benchmarks/checks/load.py -- nox -s tests` (issue: the tests
must pass under load; docs/benchmarks.md has the measured times).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import threading
import time


def spin(stop) -> None:
    """Busy work until `stop` is set: arithmetic in a loop, checking the event every 100,000 iterations."""
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x = (x * 31 + i) % 1_000_003


class Load:
    """`workers` spinning processes, started on entry and stopped (and reaped) on exit; `peak_load` is the highest
    1-minute load average sampled each second meanwhile."""

    def __init__(self, workers: int):
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=spin, args=(self.stop,), name=f"load{i}", daemon=True)
                      for i in range(workers)]
        self.peak_load = 0.0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(1.0):
            self.peak_load = max(self.peak_load, os.getloadavg()[0])

    def __enter__(self) -> Load:
        for p in self.procs:
            p.start()
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self.peak_load = max(self.peak_load, os.getloadavg()[0])
        self._done.set()
        self.stop.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Everything after -- is the command to run under the load.")
    parser.add_argument("--workers", type=int, default=2, help="busy processes (default 2: one per core here)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="without a command: how long to load the machine (default 60)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    start = time.monotonic()
    with Load(args.workers) as load:
        if command:
            code = subprocess.run(command).returncode
        else:
            time.sleep(max(0.0, args.seconds))
            code = 0
    wall = time.monotonic() - start
    what = " ".join(command) if command else f"{args.seconds:g} s of load"
    print(f"load.py: {what}: exit {code} in {wall:.1f} s under {args.workers} busy processes (1-minute load average "
          f"up to {load.peak_load:.1f} on {os.cpu_count()} CPUs)", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
