"""Where a run listens: the rendezvous store on one address (loopback for local runs), never on every interface.

torch's TCPStore, asked to host on "127.0.0.1", listens on every interface (`*:PORT`), unauthenticated; the ranks
then exchange state through it. Here the socket is bound by us, to the one address the run needs, and handed to the
store (`master_listen_fd`). gloo's own connections between ranks follow GLOO_SOCKET_IFNAME: the loopback interface
for local runs (harness/launch/local.py), the site's interface on a cluster (harness/launch/slurm.py).
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import socket
import struct

LOOPBACK = "127.0.0.1"
_SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address


def loopback_interface() -> str:
    """The name of this machine's loopback interface ("lo" on Linux, "lo0" on macOS and the BSDs)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return next((name for name in names if name.startswith("lo")), "lo")


def interface_address(name: str) -> str:
    """The IPv4 address of the network interface `name` (Linux). ValueError naming it when it has none here."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            raise ValueError(f"network interface {name!r}: no IPv4 address on this host ({exc.strerror})") from None
    return socket.inet_ntoa(packed[20:24])


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def bound_socket(address: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on `address` only (port 0: a free port the kernel picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def cluster_addresses(master: str, hosts: list[str], interface: str | None,
                      resolve=socket.gethostbyname) -> tuple[str, str]:
    """(the address every task dials, the one rank 0's store listens on) for a job on `hosts` whose first task runs
    on `master`. One host: loopback for both. Several: the address `master` resolves to, for both; where rank 0's
    own host resolves its name to a loopback address while other hosts do not (a common /etc/hosts line), the
    address of the site's `interface` instead, and without one a ValueError saying to name it."""
    if len(set(hosts)) <= 1:
        return LOOPBACK, LOOPBACK
    address = resolve(master)
    if not is_loopback(address) or all(is_loopback(resolve(h)) for h in hosts):
        return master, address  # (all on loopback: several "nodes" on one machine, as the test cluster has)
    if interface:
        return master, interface_address(interface)
    raise ValueError(f"rank 0's host {master} resolves its own name to {address}, a loopback address, while the job "
                     f"spans {', '.join(sorted(set(hosts)))}: name the network interface the ranks reach each other "
                     "on in the site profile (interface = \"ib0\", say), so that the store listens there only")


def hosted_store(address: str, world_size: int | None, port: int = 0, timeout_s: float = 300.0):
    """A TCPStore served from this process that listens on `address` only (port 0: a free one; its `.port` says
    which). The socket is bound here and handed over, so no other address ever accepts a connection."""
    import torch.distributed as dist

    sock = bound_socket(address, port)
    chosen = sock.getsockname()[1]
    return dist.TCPStore(address, chosen, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=sock.detach())
