"""free_port: the ports the tests and the demo listen on never come from the kernel's range for
outgoing connections, where any process's connect() could take one before its listener binds it."""
from __future__ import annotations

import socket

import pytest

from producer.local import LISTEN_FROM, _outgoing_ports, free_port


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

