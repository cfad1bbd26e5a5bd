"""The `dtbench` command line: one module per group of verbs, assembled into one parser here."""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import threading
import warnings

from harness.cli import claims, data, jobs, netcheck, project, report, run
from harness.cli.common import EPILOG

#: Verb modules, in the order `dtbench --help` lists them. Each has add(verbs) and sets `handler` on its parsers.
VERBS = (run, jobs, report, claims, netcheck, project, data)


def parser() -> argparse.ArgumentParser:
    """The whole command line: every verb with its --help."""
    top = argparse.ArgumentParser(
        prog="dtbench",
        description="Benchmark parallel DNN training methods on one shared runner: same workload, data order, "
                    "budget and evaluation; real processes and real torch.distributed communication.",
        epilog=EPILOG)
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    for module in VERBS:
        module.add(verbs)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # SIGTERM (kill, timeout) tears down like Ctrl-C: ranks stopped, namespaces removed, the run marked failed.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        with warnings.catch_warnings():
            if argv is None:  # the command line: warnings as one line each; a caller in-process keeps its own
                warnings.showwarning = _warning_line
            return args.handler(args, argv if argv is not None else sys.argv[1:])
    except KeyboardInterrupt:
        print("dtbench: interrupted; the running run was torn down and marked failed", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if argv is None:
            # The command line's process ends next: its warm server (its ranks have all ended) goes first, so that
            # no process of the command outlives it; and the interpreter's exit is spared its collections over
            # every object the imports made (about 0.25 s with torch loaded here, docs/benchmarks.md "Start-up").
            from harness.launch import warm

            warm.stop()
            gc.freeze()


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning (a skipped corrupt record, an ignored field) as one line on stderr, as errors are: no source line."""
    text = " ".join(str(message).split())
    print(f"dtbench: warning: {text}", file=file if file is not None else sys.stderr)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
