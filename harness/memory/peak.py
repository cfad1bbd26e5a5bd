"""The allocator's peak: the most bytes the device allocator had handed out (net of what existed before the method
was built) over a run's measured steps, the ground truth that plans are judged against."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C import _autograd, _profiler

from harness.memory.kinds import MEASURED_STEPS

#: The names of the markers that open and close the measured window on the CPU's event stream.
BEGIN, END = "dtbench::allocator_window_begin", "dtbench::allocator_window_end"

_active: AllocatorPeak | None = None  # the CPU meter watching now, for threads of its rank to join (`thread`)
_lock = threading.Lock()


def _memory_config() -> Any:
    """The legacy profiler's configuration with memory events only worth keeping (CPU state, profile_memory)."""
    return _profiler.ProfilerConfig(_profiler.ProfilerState.CPU, False, True, False, False, False,
                                    _profiler._ExperimentalConfig())


class AllocatorPeak:
    """Watches the allocator from `start` (before the method is built, so the data set is not in it) and reports
    the peak of the bytes allocated since then and not yet freed, over steps `first` .. `first + steps - 1` of this
    process (1-based: the first step, which creates optimizer state and caches, is left out unless it is the only
    one). That is everything the method holds there (weights, gradients, optimizer state, buffers, stashes, the
    step's inputs) plus every temporary that is alive at the worst moment.

    On CUDA: `torch.cuda.max_memory_allocated` over the window, less the bytes allocated before `start`. On CPU,
    where torch keeps no such counter and host and device are one allocator: the profiler's memory events (each
    allocation and free with its size, and when), summed in time order across the rank's threads, recorded only
    while the method works (its construction, `start` to `pause`, and each step up to the window's end), so that
    the runner's own host-side allocations (the data order, evaluation, records) are not in it. A thread the rank
    starts itself (Q-FB's lanes) joins through `thread()`; the autograd engine's threads carry the profiler's
    state on their own, a communication callback on gloo's worker thread does not (the compressed ddps' hooks run
    their callbacks' work under `thread()`, methods/compression/retire.py). The profiler costs the watched steps
    some time (docs/memory.md measures it)."""

    def __init__(self, device: torch.device, first: int = 2, steps: int = MEASURED_STEPS):
        if first < 1 or steps < 1:
            raise ValueError(f"the measured window needs first >= 1 and steps >= 1, got first={first}, steps={steps}")
        self.device, self.first, self.last = device, first, first + steps - 1
        self.cuda = device.type == "cuda"
        self.peak: int | None = None
        self.measured = 0  # steps inside the window, once done
        self._steps = 0
        self._done = False
        self._recording = False
        self._base = 0
        self._events: list[Any] = []  # the legacy profiler's event lists, one per thread and recording

    # -- the run's hooks ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Before the method is built."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._record(True)

    def pause(self) -> None:
        """After the method is built (and its plan made), before the runner's own set-up."""
        self._record(False)

    def begin_step(self) -> None:
        """Before a training step."""
        if self._done:
            return
        self._steps += 1
        self._record(True)
        if self._steps == self.first:
            self._mark(BEGIN)
            if self.cuda:
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)

    def end_step(self) -> None:
        """After a training step: closes the window after its last step."""
        if self._done:
            return
        if self._steps >= self.last:
            self._mark(END)
            self.stop()
        else:
            self._record(False)

    def stop(self) -> int | None:
        """End the watch (after the window; or at the end of training for a run with fewer steps: then the window
        is its steps after the first, or the first alone). Returns the peak in bytes, None when no step ran."""
        if self._done:
            return self.peak
        self._done = True
        self._record(False)
        if self._steps == 0:
            return None
        self.measured = self._steps - self.first + 1 if self._steps >= self.first else self._steps
        if self.cuda:
            torch.cuda.synchronize(self.device)  # the peak since the window opened (since start, if it never did)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self.peak = window_peak(self._events, started=self._steps >= self.first)
        return self.peak

    # -- recording (CPU) ---------------------------------------------------------------------------------------
    def _record(self, on: bool) -> None:
        global _active
        if self.cuda or on == self._recording:
            return
        with _lock:
            if on:
                if _active is not None or _autograd._profiler_enabled():
                    raise RuntimeError("the allocator peak needs the profiler, and it is already on in this process")
                _autograd._enable_profiler_legacy(_memory_config())
                _active = self
            else:
                _active = None
                self._events.append(_autograd._disable_profiler_legacy())
        self._recording = on

    def _mark(self, name: str) -> None:
        if self._recording:
            handle = _autograd._record_function_with_args_enter(name)
            _autograd._record_function_with_args_exit(handle)

    @contextlib.contextmanager
    def _thread(self) -> Iterator[None]:
        _autograd._enable_profiler_legacy(_memory_config())
        try:
            yield
        finally:
            events = _autograd._disable_profiler_legacy()
            with _lock:
                self._events.append(events)


@contextlib.contextmanager
def thread() -> Iterator[None]:
    """Around work that a rank runs on a thread of its own (not the autograd engine's, not a communication
    callback's): its allocations join the rank's allocator peak while one is being measured; else nothing."""
    meter = _active
    if meter is None or meter.cuda or _autograd._profiler_enabled():
        yield
        return
    with meter._thread():
        yield


def window_peak(events: list[Any], started: bool = True) -> int:
    """The peak of the net allocated bytes inside the window (between the BEGIN and END markers; from the first
    event when `started` is False, as for a run whose only step is its first), from the legacy profiler's event
    lists of every thread, merged in time order. The running total starts at zero at the watch's start."""
    flat = [e for per_thread in events for lst in per_thread for e in lst]
    if not flat:
        return 0
    zero = min(flat, key=lambda e: flat[0].cpu_elapsed_us(e))  # the earliest event (a.cpu_elapsed_us(b): b - a)
    marks = {e.name(): zero.cpu_elapsed_us(e) for e in flat if e.kind() == "push" and e.name() in (BEGIN, END)}
    begin = marks.get(BEGIN, 0.0) if started else 0.0
    end = marks.get(END, float("inf"))
    # stable: one thread's events keep their order where the clock cannot tell them apart
    changes = sorted(((zero.cpu_elapsed_us(e), e.cpu_memory_usage()) for e in flat if e.kind() == "memory_alloc"),
                     key=lambda change: change[0])
    total = peak = 0
    for when, delta in changes:
        if when > end:
            break
        total += delta
        if when >= begin:
            peak = max(peak, total)
    before = sum(delta for when, delta in changes if when < begin)
    return max(peak, before)


def peak_of(fn: Callable[[], Any], device: torch.device) -> int:
    """The allocator's peak on `device` while `fn()` runs, net of what was allocated before it: the most bytes `fn` had
    allocated and not yet freed at any moment (a plan's profile of a forward and backward, say). On CUDA from
    `torch.cuda.max_memory_allocated` (its peak statistic is reset: call this before a run's measured window, as
    a plan is made); on CPU from the profiler's memory events of this thread and the threads that join it. A
    meter watching this process (AllocatorPeak, recording the method's construction and plan) is paused for it and
    given its events, so that the rank's own watch misses nothing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with _lock:
        meter = _active if _active is not None and _active._recording else None
        if meter is not None:
            meter._events.append(_autograd._disable_profiler_legacy())
        elif _autograd._profiler_enabled():
            raise RuntimeError("peak_of needs the profiler, and another profiler is on in this process")
        _autograd._enable_profiler_legacy(_memory_config())
    events = None
    try:
        fn()
    finally:
        with _lock:
            events = _autograd._disable_profiler_legacy()
            if meter is not None:
                meter._events.append(events)
                _autograd._enable_profiler_legacy(_memory_config())
    return window_peak([events], started=False)
