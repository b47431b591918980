"""How long a Redis call waits out an outage (`contract/redis_link/retries.py`): the fleet's retries on every
thread but one failing fast (a worker's event loop), on the same client and connections."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import redis

from contract.redis_link import retries
from contract.redis_link.connections import redis_for

from waiting import wait_until


class DroppingListener:
    """A Redis going down, seen from a client: every connection is accepted and closed at once,
    and counted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            conn.close()


def test_a_thread_failing_fast_gives_up_after_one_reconnection_while_others_keep_retrying():
    # Given the worker's shared client (two connections) on a Redis that drops every connection
    down = DroppingListener()
    client = redis_for(down.url, 2)

    # When the event loop's thread (failing fast) makes a call
    with retries.failing_fast(), pytest.raises(redis.ConnectionError):
        client.set("k", "v")

    # Then it gave up after a few connections: one try and one more (the pool's checkout, which
    # reconnects a connection it finds closed once, counts twice for each)
    assert 1 <= down.accepted <= 4
    tried = down.accepted

    # and a call of any other thread on the same client goes on trying past that (the fleet's retries)
    threading.Thread(target=lambda: _ignoring_errors(client.set, "k", "v"), daemon=True).start()
    wait_until(lambda: down.accepted >= tried + 3, 30, "another thread's call retrying")
    down.sock.close()


def test_a_thread_failing_fast_does_not_wait_long_for_a_connection_the_others_hold(server):
    # Given a shared pool whose one connection another thread holds (as retrying threads do
    # through an outage)
    client = redis_for(server, 1)
    held = client.connection_pool.get_connection()

    # When the event loop's thread (failing fast) makes a call, it gives up waiting for one
    with retries.failing_fast(), pytest.raises(redis.ConnectionError, match="No connection available"):
        client.ping()

    # while any other thread's call waits for it, and is served once it is free
    served = []
    other = threading.Thread(target=lambda: served.append(client.ping()))
    other.start()
    other.join(retries.FAIL_FAST_WAIT + 1)
    assert other.is_alive() and served == []
    client.connection_pool.release(held)
    other.join(30)
    assert served == [True]


def _ignoring_errors(call, *args) -> None:
    try:
        call(*args)
    except redis.RedisError:
        pass


def test_once_its_wait_ran_out_the_failing_fast_thread_waits_no_more_until_it_gets_a_connection(server):
    # Given a shared pool whose one connection another thread holds, and the event loop's thread
    # (failing fast) that already waited for one in vain
    client = redis_for(server, 1)
    held = client.connection_pool.get_connection()
    with retries.failing_fast(), pytest.raises(redis.ConnectionError, match="No connection available"):
        client.ping()

    # When it makes its next calls (its backlog during an outage: an acknowledgement per task)
    started = time.monotonic()
    for _ in range(5):
        with retries.failing_fast(), pytest.raises(redis.ConnectionError, match="No connection available"):
            client.ping()

    # Then each fails at once, not after another wait: five waits would take 5 x FAIL_FAST_WAIT
    assert time.monotonic() - started < retries.FAIL_FAST_WAIT

    # and once a connection is free it is served, and a later shortage is waited for again
    client.connection_pool.release(held)
    with retries.failing_fast():
        assert client.ping()
    held = client.connection_pool.get_connection()
    started = time.monotonic()
    with retries.failing_fast(), pytest.raises(redis.ConnectionError, match="No connection available"):
        client.ping()
    assert time.monotonic() - started >= retries.FAIL_FAST_WAIT * 0.9
    client.connection_pool.release(held)
