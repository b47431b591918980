"""Routing: the least-loaded usable server that serves the prompt's model, below the cap.

Given bindings set by hand (the state the health monitor would have given
them), when task threads acquire slots, then they land where the router
promises, and a prompt with nowhere to go waits, then gives up.
"""
from __future__ import annotations

import threading

import pytest

from contract.names import ServerState
from workers.servers.bindings import NoServer, ServerPool


def pool(*specs: tuple[str, str, str | None], cap: int = 2) -> ServerPool:
    """(url, state, model) per server; healthy ones are preflighted."""
    p = ServerPool([url for url, _, _ in specs], cap)
    for binding, (_, state, model) in zip(p.bindings, specs):
        binding.state, binding.preflighted, binding.model_path = ServerState(state), True, model
    return p


def test_the_least_loaded_usable_server_is_chosen():
    p = pool(("a", "healthy", "m"), ("b", "healthy", "m"))
    with p.acquire("m", 0.1) as first, p.acquire("m", 0.1) as second:
        assert {first.url, second.url} == {"a", "b"}
        assert [b.in_flight for b in p.bindings] == [1, 1]
    assert [b.in_flight for b in p.bindings] == [0, 0]


@pytest.mark.parametrize("state", ["unknown", "loading", "warming", "down", "refused"])
def test_a_server_that_is_not_healthy_gets_nothing(state):
    p = pool(("a", state, "m"), ("b", "healthy", "m"))
    with p.acquire("m", 0.1) as b1, p.acquire("m", 0.1) as b2:
        assert b1.url == b2.url == "b"


def test_a_healthy_server_not_yet_preflighted_gets_nothing():
    p = pool(("a", "healthy", "m"))
    p.bindings[0].preflighted = False
    with pytest.raises(NoServer):
        with p.acquire("m", 0.05):
            pass


def test_a_run_that_names_a_model_goes_only_to_servers_of_that_model():
    p = pool(("a", "healthy", "other"), ("b", "healthy", "m"))
    with p.acquire("m", 0.1) as binding:
        assert binding.url == "b"
    with p.acquire(None, 0.1) as binding:  # a run without --served-model takes any
        assert binding.url in ("a", "b")


def test_the_served_model_name_counts_as_well_as_the_model_path():
    p = pool(("a", "healthy", "/models/x"))
    p.bindings[0].served_model_name = "x"
    with p.acquire("x", 0.1) as binding:
        assert binding.url == "a"


def test_a_retry_avoids_the_server_that_just_failed_when_another_is_free():
    p = pool(("a", "healthy", "m"), ("b", "healthy", "m"))
    with p.acquire("m", 0.1, avoid="a") as binding:
        assert binding.url == "b"
    only = pool(("a", "healthy", "m"))
    with only.acquire("m", 0.1, avoid="a") as binding:  # nowhere else: the same server again
        assert binding.url == "a"


def test_no_server_takes_more_than_the_cap_and_a_prompt_past_it_gives_up_in_time():
    p = pool(("a", "healthy", "m"), cap=2)
    with p.acquire("m", 0.1), p.acquire("m", 0.1):
        with pytest.raises(NoServer, match="no healthy server"):
            with p.acquire("m", 0.05):
                pass


def test_a_waiting_prompt_takes_the_slot_another_releases():
    p = pool(("a", "healthy", "m"), cap=1)
    got: list[str] = []
    with p.acquire("m", 0.1):
        waiter = threading.Thread(target=lambda: got.append(_take(p)))
        waiter.start()
        waiter.join(0.2)
        assert got == []  # still waiting while the slot is held
    waiter.join(5)
    assert got == ["a"]


def _take(p: ServerPool) -> str:
    with p.acquire("m", 5) as binding:
        return binding.url
