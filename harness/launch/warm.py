"""Warm rank processes: a forkserver that imports torch, the harness and the built-in methods once per launching
process, from which every rank forks (docs/benchmarks.md, "Start-up").

Each rank is still a fresh process of its own: it is forked from the server, which has only imported modules and
has run nothing, so no run's state (RNG, process group, tensors) reaches another run. What a rank gets from the
parent is what `spawn` gives it (sys.path, sys.argv, the working directory, the main module, through
multiprocessing's preparation data) plus the parent's environment at the rank's start, which `process` restores
(the server's own environment is the parent's when the server started).

`DTBENCH_START_METHOD=spawn` starts every rank in a fresh interpreter instead, as before the warm start: slower (each
rank imports torch again), for a plug-in that cannot bear a fork.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import forkserver, resource_tracker
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

START_METHOD_VARIABLE = "DTBENCH_START_METHOD"
START_METHODS = ("forkserver", "spawn")

#: What every rank of every run imports, in import order. `torch._inductor.config` is imported by
#: torch.use_deterministic_algorithms, and brings torch._dynamo, which building any torch.optim optimizer imports
#: too (about 0.9 s here, close to a torch import); the harness modules are those the worker imports in its run.
CORE_MODULES = (
    "numpy", "torch", "torch.distributed", "torch._inductor.config",
    "harness.launch.local", "harness.run.worker", "harness.run.loop", "harness.run.manifest", "harness.optim",
    "harness.evaluation",
    "harness.registry", "harness.method", "harness.comm.communicator", "harness.workloads.builtin",
)

#: What the built-in workloads import to load their data beyond torch: nothing. The digits split is read from its
#: cache as tensors (harness/data/sources.py); scikit-learn (about 0.8 s) is needed only when that cache is cold, and
#: a server imports before the first rank can start.
DATA_MODULES: tuple[str, ...] = ()

#: The signals that ask a rank to stop after a checkpoint (harness/run/checkpoint.py's STOP handles them).
STOP_SIGNALS = frozenset({signal.SIGUSR2})

_started: list[str] = []  # the preload of the forkserver this process started (empty: none started)


def start_method() -> str:
    """`forkserver` or `spawn`, from DTBENCH_START_METHOD; ValueError naming the variable for anything else. The
    default is forkserver where the platform has it (Linux, macOS), else spawn."""
    default = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    value = os.environ.get(START_METHOD_VARIABLE, "") or default
    if value not in START_METHODS:
        raise ValueError(f"{START_METHOD_VARIABLE}={value!r}: use one of {', '.join(START_METHODS)}")
    return value


def builtin_modules() -> list[str]:
    """Every module the server preloads: the core, the built-in methods' modules, then the data libraries."""
    from harness.registry import BUILTIN_METHODS

    methods = [reference.partition(":")[0] for reference in BUILTIN_METHODS.values()]
    return list(dict.fromkeys([*CORE_MODULES, *methods, *DATA_MODULES]))


def start(modules: Iterable[str] | None = None) -> None:
    """Start this process's forkserver now, preloading `modules` (default: builtin_modules()), so that it imports
    in the background while the caller goes on; the first rank to start then waits only for what is left.

    Nothing happens under DTBENCH_START_METHOD=spawn, or when this process already started one (a server's
    preload is fixed when it starts). A module that fails to import is skipped by the server, and imported by the
    ranks that need it, as under spawn.
    """
    if start_method() != "forkserver" or _started:
        return
    preload = ["__main__", *(builtin_modules() if modules is None else modules)]
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    with held_stop_signals():  # the server inherits the mask, and every rank it forks
        forkserver.ensure_running()
    _started.extend(preload)


def stop() -> None:
    """End the forkserver this process started, and its resource tracker, before this process exits; call it only
    once every rank forked from the server has ended (the command line does, as it ends).

    The server is killed (SIGKILL), not asked to exit: it holds nothing but imported modules, and its own exit, the
    interpreter's finalization over every object that torch, torch._dynamo and the methods made, took 0.4 s of CPU
    on a quiet 2-core machine and 3.6 s under load. Left to itself it outlived `dtbench run` by that much, holding
    the command's stdout and stderr open, so a caller that reads them to their end waited for it. Both processes
    are reaped here (multiprocessing's own stop routines, `_stop`, which the standard library's tests use; skipped
    on a Python without them), so none is left when the command exits."""
    if not _started:
        return
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None and hasattr(server, "_stop"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        server._stop()  # closes the alive pipe, reaps the server, removes its socket
    tracker = resource_tracker._resource_tracker
    if hasattr(tracker, "_stop"):
        tracker._stop()  # its last holder of the pipe gone, it checks for leaks and exits: reaped here
    _started.clear()


def server_pid() -> int | None:
    """The pid of the forkserver this process started, or None (none started, or spawn)."""
    if not _started:
        return None
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def context() -> BaseContext:
    """The multiprocessing context ranks start from: the warm forkserver (started now if it is not yet), or spawn."""
    method = start_method()
    if method == "forkserver":
        start()
    return multiprocessing.get_context(method)


@contextlib.contextmanager
def held_stop_signals() -> Iterator[None]:
    """Block the stop signals (STOP_SIGNALS) in this thread while processes are started from it: a process started
    meanwhile (the forkserver, so every rank it forks, or a spawned rank) begins with them blocked, so one that
    arrives before the rank has installed its handler waits, pending, instead of killing it (the default action of
    SIGUSR2). The rank unblocks them once its handler is in place (release_stop_signals)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def release_stop_signals() -> None:
    """In a rank, after its stop handler is installed: deliver the stop signals, a pending one at once."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def process(ctx: BaseContext, target: Callable[..., Any], args: tuple, name: str) -> BaseProcess:
    """A process of `ctx` that runs target(*args) in this process's environment as it is now. It starts with the
    stop signals blocked (held_stop_signals): a target that wants them installs its handler, then calls
    release_stop_signals, as the local launcher's ranks do; others (the tests' helper ranks) never see them."""
    return ctx.Process(target=run_in_environment, name=name, args=(dict(os.environ), target, args))


def run_in_environment(environ: dict[str, str], target: Callable[..., Any], args: tuple) -> Any:
    """Replace this process's environment by `environ`, then run target(*args). No socket and no thread is
    created first, so a target that enters a network namespace still comes first (harness/launch/local.py)."""
    os.environ.clear()
    os.environ.update(environ)
    return target(*args)
