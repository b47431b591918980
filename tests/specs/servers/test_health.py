"""The health monitor's state machine, fed probe outcomes directly (no HTTP).

Given a binding and the settings' thresholds, when probes report healthy,
warming, loading or down, then the binding's state follows the rules: down
after `health_failures` failures in a row (at once when it was never
healthy), back after `health_successes` successes, preflighted on the way
back, and a refused server stays refused until a preflight clears it.
"""
from __future__ import annotations

from contract.names import ServerState
from workers.servers.health import HealthMonitor
from workers.servers.bindings import ServerBinding, ServerPool
from workers.settings import Settings

H, W, L, D = ServerState.HEALTHY, ServerState.WARMING, ServerState.LOADING, ServerState.DOWN


def monitor(refusal: str | None = None) -> tuple[HealthMonitor, ServerBinding, list[str]]:
    calls: list[str] = []

    def preflight(_client, binding: ServerBinding) -> None:
        calls.append(binding.url)
        binding.model_path, binding.refusal, binding.max_model_len = "m", refusal, 4096

    settings = Settings(sglang_urls="http://a", health_failures=3, health_successes=2)
    pool = ServerPool(["http://a"], 4)
    return HealthMonitor(pool, settings, {}, preflight=preflight), pool.bindings[0], calls


def feed(m: HealthMonitor, b: ServerBinding, *observed: ServerState) -> list[ServerState]:
    states = []
    for state in observed:
        m.observe(b, state, "" if state == H else f"{state} probe")
        states.append(b.state)
    return states


def test_a_new_server_is_usable_after_two_healthy_probes_and_a_preflight():
    m, b, calls = monitor()
    assert feed(m, b, H) == [ServerState.UNKNOWN]
    assert not b.usable
    assert feed(m, b, H) == [H]
    assert b.usable and calls == ["http://a"]


def test_a_loading_server_is_marked_at_once_when_it_was_never_healthy():
    m, b, _ = monitor()
    assert feed(m, b, L, W) == [L, W]


def test_a_healthy_server_survives_two_failed_probes_and_goes_down_at_the_third():
    m, b, _ = monitor()
    feed(m, b, H, H)
    assert feed(m, b, D, D, D) == [H, H, D]
    assert not b.usable


def test_one_good_probe_between_failures_resets_the_count():
    m, b, _ = monitor()
    feed(m, b, H, H)
    assert feed(m, b, D, D, H, D, D) == [H, H, H, H, H]


def test_a_server_coming_back_is_preflighted_again():
    m, b, calls = monitor()
    feed(m, b, H, H, D, D, D)
    assert feed(m, b, H, H) == [D, H]
    assert b.usable and calls == ["http://a", "http://a"]


def test_a_server_the_preflight_refuses_is_refused_and_never_usable():
    m, b, _ = monitor(refusal="allow_auto_truncate is on")
    assert feed(m, b, H, H, H) == [ServerState.UNKNOWN, ServerState.REFUSED, ServerState.REFUSED]
    assert not b.usable and b.refusal


def test_a_server_that_restarts_with_another_batch_gets_a_target_from_its_new_capacity():
    # Given a server whose preflight reads a batch of 64, then (after a restart) of 256
    capacities = iter([64, 256])
    settings = Settings(sglang_urls="http://a", health_failures=3, health_successes=2)
    pool = ServerPool(["http://a"], 1024)
    def preflight(_client, binding: ServerBinding) -> int:
        binding.max_model_len = 4096
        return next(capacities)

    m = HealthMonitor(pool, settings, {}, preflight=preflight)
    b = pool.bindings[0]
    feed(m, b, H, H)
    assert (b.capacity, b.target) == (64, 72)
    b.tuner.target = 30  # tuned down meanwhile (another worker shared it)
    # When it goes down and comes back
    feed(m, b, D, D, D, H, H)
    # Then its target starts again from the capacity read afresh
    assert (b.capacity, b.target) == (256, 288)


def test_a_server_that_died_under_requests_is_out_of_service_until_a_preflight_even_if_never_seen_down():
    # Given a healthy, preflighted server with a crash suspect's hold, restarted so fast that /health never failed
    m, b, calls = monitor()
    feed(m, b, H, H)
    assert b.usable and calls == ["http://a"]

    # When requests there met its death (once for each of them: one death)
    m.died(b, 1000.0, "it died with requests in flight")
    m.died(b, 1000.0, "it died with requests in flight")

    # Then it is out of service at once, and back only after healthy probes and a new preflight, after which
    # its crash hold ends with the grace (its ready time is after the death)
    assert b.state == L and not b.usable
    assert feed(m, b, H, H) == [L, H]
    assert b.usable and calls == ["http://a", "http://a"]
    assert b.ready_at >= b.crashed_at
    # and a later death is one more: out of service again
    feed(m, b, H)
    m.died(b, 2000.0, "it died with requests in flight")
    assert b.state == L
