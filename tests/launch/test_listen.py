"""Where a run listens: one address, never every interface (harness/net/listen.py)."""

from __future__ import annotations

import socket

import pytest

from harness.net.listen import LOOPBACK, bound_socket, cluster_addresses, hosted_store, loopback_interface


def test_a_hosted_store_listens_on_its_address_only_and_serves_clients():
    import torch.distributed as dist

    store = hosted_store(LOOPBACK, 2)
    client = dist.TCPStore(LOOPBACK, store.port, 2, is_master=False)
    client.set("k", "v")
    assert store.get("k") == b"v"
    # Nothing answers at the port on another of this machine's addresses (on every interface it did).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        other = _non_loopback_address()
        if other is not None:
            assert probe.connect_ex((other, store.port)) != 0


def _non_loopback_address() -> str | None:
    """An address of this machine outside 127/8, where it has one (the address a route out would leave from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_bound_socket_is_on_the_address_asked_for():
    with bound_socket(LOOPBACK) as sock:
        assert sock.getsockname()[0] == LOOPBACK and sock.getsockname()[1] > 0


def test_the_loopback_interface_is_found():
    assert loopback_interface() in [name for _, name in socket.if_nameindex()]


def resolver(table: dict[str, str]):
    return lambda host: table[host]


def test_a_job_on_one_host_dials_and_listens_on_loopback():
    assert cluster_addresses("node1", ["node1"], None, resolver({})) == (LOOPBACK, LOOPBACK)


def test_a_job_on_several_hosts_listens_on_the_address_the_first_node_resolves_to():
    table = {"a": "10.0.0.1", "b": "10.0.0.2"}
    assert cluster_addresses("a", ["a", "b"], None, resolver(table)) == ("a", "10.0.0.1")


def test_several_nodes_on_one_machine_listen_on_loopback():
    """The test cluster's n1 and n2 both resolve to 127.0.0.1 (tests/slurm_cluster.py)."""
    table = {"n1": "127.0.0.1", "n2": "127.0.0.1"}
    assert cluster_addresses("n1", ["n1", "n2"], None, resolver(table)) == ("n1", "127.0.0.1")


def test_a_node_that_resolves_its_own_name_to_loopback_needs_the_sites_interface():
    table = {"a": "127.0.1.1", "b": "10.0.0.2"}
    with pytest.raises(ValueError, match="interface = "):
        cluster_addresses("a", ["a", "b"], None, resolver(table))
    dial, listen = cluster_addresses("a", ["a", "b"], loopback_interface(), resolver(table))
    assert dial == "a" and listen == LOOPBACK  # the named interface's address (here: loopback's, for the test)
