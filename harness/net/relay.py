"""The latency relay: TUN devices in namespaces, and one thread that copies packets between them after a delay."""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import os
import selectors
import struct
import threading
import time

from harness.net.namespaces import NetworkError, enter

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000


def open_tun_in(netns: str, name: str) -> int:
    """Create TUN device `name` inside `netns` and return its (non-blocking) file descriptor.

    The device is created from a helper thread that has entered the namespace, so the launcher's own threads
    never leave the root namespace. It disappears when the descriptor is closed.
    """
    result: dict[str, int | BaseException] = {}

    def create() -> None:
        try:
            enter(netns)
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
            result["fd"] = fd
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result["error"] = exc

    thread = threading.Thread(target=create, name=f"tun-{netns}")
    thread.start()
    thread.join()
    if "error" in result:
        raise NetworkError(f"network setup failed: TUN device {name} in {netns}: {result['error']}")
    return int(result["fd"])


class Relay:
    """Copies packets between pairs of TUN file descriptors, each one `delay_s` after it was read.

    One thread, one selector and a heap of (due time, packet). A packet read from one end of a pair is written to
    the other end once due, in order within a direction; it is dropped only when the device refuses it.
    """

    def __init__(self, pairs: list[tuple[int, int]], delay_s: float):
        self.delay_s = delay_s
        self.peer = {a: b for a, b in pairs} | {b: a for a, b in pairs}
        self.packets = 0
        self.dropped = 0
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="dtbench-relay", daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        return self

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        for fd in self.peer:
            selector.register(fd, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        queue: list[tuple[float, int, int, bytes]] = []
        order = itertools.count()
        while not self._stop:
            timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
            for key, _ in selector.select(timeout):
                if key.fd == self._wake_r:
                    continue
                due = time.monotonic() + self.delay_s
                while True:
                    try:
                        packet = os.read(key.fd, 65536)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:  # the device is down or went away (teardown): nothing to read
                        break
                    heapq.heappush(queue, (due, next(order), self.peer[key.fd], packet))
            now = time.monotonic()
            while queue and queue[0][0] <= now:
                _, _, out, packet = heapq.heappop(queue)
                try:
                    os.write(out, packet)
                    self.packets += 1
                except OSError:
                    self.dropped += 1  # the device is down or its queue is full: a drop, as on a real link
        selector.close()

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        for fd in (*self.peer, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
