"""free_port: the ports the tests and the demo listen on never come from the kernel's range for
outgoing connections, where any process's connect() could take one before its listener binds it,
and a port given stays its taker's while that process lives, even while nothing listens on it."""
from __future__ import annotations

import socket
import subprocess

import pytest

from producer.local import LISTEN_FROM, PORTS, _hold, _outgoing_ports, free_port


def test_a_free_port_is_outside_the_range_outgoing_connections_take_ports_from():
    # Given the kernel's range for outgoing connections, with ports left outside it
    low, high = _outgoing_ports()
    if low <= LISTEN_FROM and high >= 65535:
        pytest.skip(f"this machine's outgoing range, {low}-{high}, leaves no port outside it")

    # When ports are picked to listen on
    ports = [free_port() for _ in range(20)]

    # Then none is in that range, and each can be listened on at once
    assert not [p for p in ports if low <= p <= high]
    for port in ports:
        with socket.create_server(("127.0.0.1", port)):
            pass


def test_where_the_outgoing_range_leaves_no_port_the_kernels_pick_is_held_all_the_same(monkeypatch):
    # Given a machine whose outgoing range takes every port above LISTEN_FROM
    monkeypatch.setattr("producer.local._outgoing_ports", lambda: (1024, 65535))

    # When ports are picked to listen on
    ports = [free_port() for _ in range(5)]

    # Then the kernel picked them, each different and held for this process like any other
    assert len(set(ports)) == 5
    assert not [p for p in ports if _hold(p)]


def test_a_port_is_held_while_the_process_that_took_it_lives_and_free_again_once_it_died():
    # Given a port this process took
    port = free_port()

    # Then it is never given again while this process lives, nor while another live process holds it
    assert not _hold(port)
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (PORTS / str(port)).write_text(str(holder.pid))
        assert not _hold(port)
    finally:
        holder.kill()
        holder.wait()

    # and once its holder died, it can be taken again
    assert _hold(port)
