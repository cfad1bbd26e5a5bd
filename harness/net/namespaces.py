"""Network namespaces: entering one, running iproute2, and sweeping what a dead launcher left behind."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
#: Namespaces and root links of dtbench carry the launcher's pid, so that a sweep can find leftovers.
NETNS_PATTERN = re.compile(r"^dtb-(\d+)-\d+-")
ROOT_LINK_PATTERN = re.compile(r"^dtb(\d+)n\d+$")


class NetworkError(Exception):
    """The emulated network could not be built or is not available here. The message is one line."""


_CLONE_NEWNET = 0x40000000


def enter(netns: str) -> None:
    """Move the calling thread into the named network namespace (as `ip netns exec` does). Call it before any socket
    is opened and before any thread is started: threads started later inherit it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {netns}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def run_ip(*command: str) -> str:
    """Run an iproute2 command; a failure raises NetworkError naming the command and its error."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise NetworkError(f"network setup failed: `{' '.join(command)}`: {message[0] if message else done.returncode}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_netns() -> list[str]:
    """The names of the named network namespaces (those `ip netns` lists)."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except OSError:
        return []


def root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def sweep_stale() -> list[str]:
    """Remove the namespaces and root links that a dtbench launcher which no longer runs left behind (it was
    killed with SIGKILL, say). Returns what was removed."""
    removed = []
    for name in list_netns():
        match = NETNS_PATTERN.match(name)
        if match and not _alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
            removed.append(name)
    for link in root_links():
        match = ROOT_LINK_PATTERN.match(link)
        if match and not _alive(int(match.group(1))):
            subprocess.run(["ip", "link", "delete", link], capture_output=True, timeout=30)
            removed.append(link)
    return removed


def free_subnet() -> str:
    """A 10.213.T.0/24 that no route or address of the root namespace overlaps: '10.213.T'."""
    used = run_ip("ip", "-4", "-o", "route", "show") + run_ip("ip", "-4", "-o", "addr", "show")
    for third in range(256):
        prefix = f"10.213.{third}"
        if f"{prefix}." not in used:
            return prefix
    raise NetworkError("network setup failed: no free 10.213.T.0/24 subnet left (remove stale dtb links)")
