"""A command line for a process that a test stops with SIGINT (Ctrl-C), with SIGINT at its default action in that
process whatever started the tests.

A process inherits an ignored SIGINT, and Python then installs no KeyboardInterrupt handler: tests started from a
non-interactive shell's background job (`cmd &`: bash sets SIGINT to ignored there), from nohup, or by a runner
that ignores it, would send a Ctrl-C that `dtbench run` never sees, where a terminal's foreground command sees it
(measured: both SIGINT tests hung for their 60 s cap when pytest ran as `(pytest ... &)`). `dtbench run` keeps
honouring an ignored SIGINT (a background job should not die of the terminal's Ctrl-C); the test gives its command
the disposition of a terminal's foreground command instead: a tiny Python resets SIGINT to its default, then execs
the command in its own process (same pid), where the new interpreter installs its KeyboardInterrupt handler."""

from __future__ import annotations

import sys

_EXEC_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])")


def with_default_sigint(argv: list[str]) -> list[str]:
    """argv (its program a path, e.g. sys.executable) run with SIGINT at its default action."""
    return [sys.executable, "-c", _EXEC_WITH_DEFAULT_SIGINT, *argv]
