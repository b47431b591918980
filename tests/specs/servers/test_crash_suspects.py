"""A server that dies with prompts in flight: how a request learns it (`ServerDropped`, `CrashWatch`), which
prompt is its cause (`server_crashes.convicted`), and how the suspects probe first (`ServerPool`).

Given a loopback server that closes a request's connection without a byte of answer, the call is
`ServerDropped`; given one that answers, then closes, then answers again, the watch says it lives;
given a port that refuses connections, it died. Given a crash, the worker's other prompts wait while its
suspects probe the restarted server, and for a grace after it is back.
"""
from __future__ import annotations

import socket
import time

import httpx
import pytest

from contract.names import ServerState
from workers.intake.server_crashes import convicted
from workers.servers import bindings
from workers.servers.bindings import NoServer, ServerPool
from workers.servers.crashes import CrashWatch
from workers.servers.sglang_client import ServerDropped, make_client, send

from .test_generate_call import reply, serve  # noqa: F401  (the scripted loopback server)


def hang_up(conn: socket.socket, _) -> None:
    conn.shutdown(socket.SHUT_RDWR)


def test_a_request_whose_connection_closes_with_no_answer_is_dropped(serve):  # noqa: F811
    server = serve(hang_up)
    client = make_client(4, connect_timeout=5, request_timeout=30, api_key=None)
    with pytest.raises(ServerDropped):
        send(client, f"{server.url}/generate", b"{}", timeout=10, max_bytes=1 << 20)


def test_a_server_whose_port_refuses_after_the_drop_died_and_one_that_answers_lives(serve):  # noqa: F811
    alive = serve(lambda conn, _: reply(conn, b"", "200 OK"))
    closed = socket.create_server(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    watch = CrashWatch(httpx.Client(), confirm_seconds=5)

    assert watch.crashed(alive.url, time.monotonic()) is None
    died = watch.crashed(dead_url, time.monotonic())
    assert died is not None and abs(died - time.time()) < 5


def test_a_prompt_is_the_cause_only_once_its_server_died_twice_while_it_was_sent_alone():
    bystander = [{"server": "a", "at": 1.0, "alone": False}]
    assert not convicted(bystander)
    assert not convicted([*bystander, {"server": "a", "at": 2.0, "alone": True}])  # an outside kill, perhaps
    assert convicted([*bystander, {"server": "a", "at": 2.0, "alone": True}, {"server": "a", "at": 3.0, "alone": True}])


def _pool() -> ServerPool:
    p = ServerPool(["a", "b"], 4)
    for binding in p.bindings:
        binding.state, binding.preflighted = ServerState.HEALTHY, True
    return p


def test_while_a_crashed_servers_suspects_wait_for_their_probes_only_they_go_there():
    p = _pool()
    a = p.bindings[0]
    p.crashed(a, 1000.0)
    p.suspected("a", "run/p1")
    a.ready_at = time.monotonic()  # back from its restart

    with p.acquire(None, 0.1, prefer="a") as other:
        assert other.url == "b"  # an ordinary prompt goes elsewhere
    with p.acquire(None, 0.1, prefer="a", suspect=True) as probe:
        assert probe.url == "a"  # the suspect probes there
    p.cleared("run/p1")
    with pytest.raises(NoServer):  # within the grace after the restart, still none but suspects
        with p.acquire(None, 0.1, only=frozenset({"a"}), checked=frozenset({"a", "b"})):
            pass


def test_after_the_grace_and_the_probes_the_server_takes_every_prompt_again(monkeypatch):
    monkeypatch.setattr(bindings, "PROBE_GRACE", 0.2)
    p = _pool()
    a = p.bindings[0]
    p.crashed(a, 1000.0)
    a.ready_at = time.monotonic()
    time.sleep(0.3)
    with p.acquire(None, 0.1, only=frozenset({"a"}), checked=frozenset({"a", "b"})) as again:
        assert again.url == "a" and a.crashed_at is None


def test_a_crashed_server_not_back_yet_holds_its_prompts_however_long_ago_it_died(monkeypatch):
    monkeypatch.setattr(bindings, "PROBE_GRACE", 0.0)
    p = _pool()
    a = p.bindings[0]
    a.ready_at = time.monotonic()
    p.crashed(a, 1000.0)  # after its last preflight: not back yet
    assert a.held_for_probes(time.monotonic() + 3600)


def test_a_server_usable_since_the_runs_servers_were_checked_is_checked_before_it_gets_a_prompt():
    # Given a run checked against server a alone (b was not usable then), and b usable now
    p = _pool()
    # When a prompt of the run asks for a server, Then it is told to check again rather than sent to b
    with pytest.raises(bindings.Recheck):
        with p.acquire(None, 0.1, only=frozenset({"a"}), checked=frozenset({"a"})):
            pass
