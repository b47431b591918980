"""Behind SGLang's gateway: which answers are its own outage, what fits a context, and how the
preflight judges a gateway from the servers it lists.

Given the bodies sglang-router 0.3.2 answers (and SGLang's servers), when the
worker reads them, then an outage of the gateway is told apart from a server
judging the prompt, a budget always leaves SGLang's one token, and a gateway is
refused, named with the server at fault, wherever a server behind it would be.
The gateway and servers are httpx transports answering their recorded bodies.
"""
from __future__ import annotations

import json

import httpx
import pytest

from contract.names import ServerState
from workers.servers.gateway_answers import OUTAGE, UPSTREAM, gateway_failure
from workers.intake.request_loop import fit_context, prompt_too_long
from workers.servers.health import HealthMonitor
from workers.servers.preflight import Unreadable, preflight, settle_context
from workers.servers.bindings import ServerBinding, ServerPool
from workers.settings import Settings
from workers.servers.sglang_client import GatewayOutage, ServerRejected, ServerUnavailable, TransientError, failure

NO_WORKERS = json.dumps({"error": {"type": "Service Unavailable", "code": "no_available_workers",
                                   "message": "No available workers (all circuits open or unhealthy)"}}).encode()
UPSTREAM_LOST = json.dumps({"error": {"type": "Internal Server Error", "code": "call_upstream_connection_failed",
                                      "message": "error sending request. URL: http://w/generate"}}).encode()
TOO_LONG = json.dumps({"error": {"message": "Requested token count exceeds the model's maximum context length "
                                            "of 2048 tokens."}}).encode()
QUEUE_FULL = json.dumps({"error": {"message": "The request queue is full."}}).encode()


@pytest.mark.parametrize("status, body, kind", [
    (503, NO_WORKERS, OUTAGE),
    (503, b"No available workers", OUTAGE),                   # a router that writes no code
    (500, UPSTREAM_LOST, UPSTREAM),
    (504, json.dumps({"error": {"code": "call_upstream_timeout", "message": "t"}}).encode(), UPSTREAM),
    (503, QUEUE_FULL, None),                                  # a server's own 503: its queue
    (400, TOO_LONG, None),                                    # a server judging the prompt
    (500, b"Internal Server Error", None),
])
def test_the_gateways_own_failures_are_told_apart_from_a_servers_answers(status, body, kind):
    assert gateway_failure(status, body) == kind


def test_a_gateway_outage_is_its_own_failure_class_and_a_servers_answers_keep_theirs():
    assert isinstance(failure("http://gw", 503, NO_WORKERS), GatewayOutage)
    assert isinstance(failure("http://gw", 500, UPSTREAM_LOST), ServerUnavailable)
    assert isinstance(failure("http://s", 503, QUEUE_FULL), TransientError)
    assert isinstance(failure("http://s", 400, TOO_LONG), ServerRejected)


def test_a_budget_is_cut_to_what_sglang_answers_and_a_prompt_without_room_is_too_long():
    # SGLang 0.5.23 answers at most context - 2 - prompt tokens: 2048 - 2 - 100 = 1946
    assert fit_context({"max_new_tokens": 4096}, 100, 2048) == {"max_new_tokens": 1946}
    assert fit_context({"max_new_tokens": 1000}, 100, 2048) == {"max_new_tokens": 1000}
    assert prompt_too_long(2045, 2048, None) is None
    assert "no room" in prompt_too_long(2046, 2048, None)
    assert "max_req_input_len" in prompt_too_long(2040, 2048, 2040)


def test_an_unread_context_length_refuses_unless_the_setting_gives_it_and_the_smaller_wins():
    binding = ServerBinding("http://gw", max_model_len=None, unread="the context length of http://s (not reachable)")
    with pytest.raises(Unreadable, match="http://s.*FLEET_CONTEXT_LENGTH"):
        settle_context(binding, 0)
    settle_context(binding, 4096)
    assert binding.max_model_len == 4096
    read = ServerBinding("http://s", max_model_len=2048)
    settle_context(read, 4096)
    assert read.max_model_len == 2048
    with pytest.raises(Unreadable):
        settle_context(ServerBinding("http://s"), 0)   # a server that reports none


def server(context: int, batch: int, model: str = "m", truncate: bool = False) -> dict[str, dict]:
    info = {"model_path": model, "context_length": context, "max_running_requests": batch,
            "allow_auto_truncate": truncate, "max_req_input_len": context - 6}
    return {"/model_info": {"model_path": model, "is_generation": True}, "/server_info": info,
            "/v1/models": {"data": [{"id": model, "max_model_len": context}]}}


def client_for(servers: dict[str, dict[str, dict]], unreachable: tuple[str, ...] = ()) -> httpx.Client:
    """The gateway at http://gw (sglang-router 0.3.2's answers) listing `servers` and `unreachable`."""
    listed = [*servers, *unreachable]

    def answer(request: httpx.Request) -> httpx.Response:
        origin, path = f"http://{request.url.host}", request.url.path
        if origin == "http://gw":
            if path == "/workers":
                return httpx.Response(200, json={"workers": [{"url": u, "is_healthy": True} for u in listed]})
            if path == "/get_server_info":
                return httpx.Response(200, json={"router_manager": True, "routers_count": 1})
            if path == "/get_model_info":
                return httpx.Response(200, json={"model_path": "m", "is_generation": True})
            return httpx.Response(404)
        if origin in unreachable:
            raise httpx.ConnectError("refused", request=request)
        found = servers[origin].get(path)
        return httpx.Response(200, json=found) if found is not None else httpx.Response(404)

    return httpx.Client(transport=httpx.MockTransport(answer))


def judged(servers: dict[str, dict[str, dict]], unreachable: tuple[str, ...] = ()) -> tuple[ServerBinding, object]:
    binding = ServerBinding("http://gw")
    return binding, preflight(client_for(servers, unreachable), binding)


def test_a_gateway_takes_the_smallest_context_and_the_sum_of_capacities_of_its_servers():
    binding, capacity = judged({"http://a": server(4096, 8), "http://b": server(2048, 16)})
    assert (binding.refusal, binding.model_path, binding.max_model_len, binding.max_input_len, capacity) == \
        (None, "m", 2048, 2042, 24)
    assert binding.gateway_workers == ["http://a", "http://b"]


def test_a_gateway_with_a_server_that_truncates_or_servers_of_two_models_is_refused_naming_them():
    binding, _ = judged({"http://a": server(2048, 8), "http://b": server(2048, 8, truncate=True)})
    assert binding.refusal.startswith("its server http://b: allow_auto_truncate is on")
    binding, _ = judged({"http://a": server(2048, 8), "http://b": server(2048, 8, model="other")})
    assert "different models" in binding.refusal


def test_a_gateway_whose_server_cannot_be_reached_leaves_the_context_unread():
    binding, _ = judged({"http://a": server(2048, 8)}, unreachable=("http://b",))
    assert binding.refusal is None and "http://b (not reachable)" in binding.unread
    with pytest.raises(Unreadable, match="http://b"):
        settle_context(binding, 0)
    settle_context(binding, 4096)
    assert binding.max_model_len == 2048     # the server read says less than the setting


def test_an_outage_answer_takes_a_healthy_gateway_down_at_once_and_probes_bring_it_back():
    settings = Settings(sglang_urls="http://gw", health_failures=3, health_successes=2)
    pool = ServerPool(["http://gw"], 4)
    cuts = []

    def ok(_client, binding: ServerBinding) -> int:
        binding.max_model_len = 2048
        return 8

    monitor = HealthMonitor(pool, settings, {}, preflight=ok, cut=lambda b, why: cuts.append(why) or 0)
    binding = pool.bindings[0]
    for _ in range(2):
        monitor.observe(binding, ServerState.HEALTHY, "")
    assert binding.usable

    # When a request gets the gateway's outage answer
    monitor.outage(binding, "HTTP 503 No available workers")

    # Then it is down at once, its other requests left to finish, and one good probe is not enough
    assert (binding.state, binding.usable, cuts) == (ServerState.DOWN, False, [])
    monitor.observe(binding, ServerState.HEALTHY, "")
    assert binding.state == ServerState.DOWN
    monitor.observe(binding, ServerState.HEALTHY, "")
    assert binding.usable


def test_a_gateway_ready_by_its_readiness_but_refusing_generations_is_seen_down_by_the_probes():
    # Given a gateway whose /readiness says ready while /generate answers 503 No available workers
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.path}")
        if request.url.path == "/readiness":
            return httpx.Response(200, json={"status": "ready"})
        if request.url.path == "/generate":
            return httpx.Response(503, content=NO_WORKERS)
        return httpx.Response(200)

    settings = Settings(sglang_urls="http://gw", health_failures=3, health_successes=2)
    pool = ServerPool(["http://gw"], 4)
    monitor = HealthMonitor(pool, settings, {})
    monitor.client = httpx.Client(transport=httpx.MockTransport(answer))
    binding = pool.bindings[0]

    # When a binding not judged yet is probed, the gateway's /readiness is asked first
    assert monitor._probe(binding)[0] == ServerState.HEALTHY and asked == ["GET /readiness"]

    # When it is a known gateway, healthy, with nothing of this worker in flight there
    binding.gateway_workers, binding.state, binding.preflighted = ["http://a"], ServerState.HEALTHY, True
    state, why = monitor._probe(binding)

    # Then a one-token generation tells the outage, and the usual rounds take it down
    assert asked[-1] == "POST /generate" and state == ServerState.DOWN and "No available workers" in why
    for _ in range(3):
        monitor.observe(binding, state, why)
    assert binding.state == ServerState.DOWN

    # while requests of this worker in flight there answer for it instead: no probe then
    binding.state, binding.in_flight, before = ServerState.HEALTHY, 3, len(asked)
    assert monitor._probe(binding)[0] == ServerState.HEALTHY and asked[before:] == ["GET /readiness"]


@pytest.mark.parametrize("readiness", [404, 401])
def test_a_server_not_judged_yet_that_has_no_readiness_is_probed_by_its_health(readiness):
    # Given a server that answers /readiness 404 (SGLang has none) or 401 (its --api-key, not sent)
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(readiness if request.url.path == "/readiness" else 200)

    monitor = HealthMonitor(ServerPool(["http://s"], 4), Settings(sglang_urls="http://s"), {})
    monitor.client = httpx.Client(transport=httpx.MockTransport(answer))
    # Then its /health's status decides, as for any server
    assert monitor._probe(monitor.pool.bindings[0])[0] == ServerState.HEALTHY
    assert asked == ["/readiness", "/health"]
