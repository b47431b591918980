"""A worker bound to SGLang's real gateway (sglang-router 0.3.2) in front of two real SGLang servers
(their CPU engine, tests/real_sglang.py): what a user runs in production, with nothing of ours between.

The gateway answers none of the routes the worker's preflight reads, so the worker reads each server it
lists directly (workers/servers/gateway_preflight.py): the real servers' context length (their /v1/models;
/server_info has it null) and capacity must reach the worker's status through the gateway. And a server
killed behind the gateway must cost no prompt: its in-flight requests fail at the gateway, which is not a
server crash of the prompt's (workers/intake/server_crashes.py judges direct servers only).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis

from contract.fleet import heartbeats
from producer.local import free_port

from conftest import varied_prompts, write_prompts
from metric_pages import by_label, sum_of, worker_page
from real_gateway import Gateway, start_gateway
from real_sglang import CONTEXT, RealServer
from waiting import wait_until

pytestmark = pytest.mark.xdist_group("real-sglang")

CAPACITY = 2048  # each real server's effective_max_running_requests_per_dp at --max-total-tokens 16384


def _two_servers(shared_sglang) -> list[RealServer]:
    """Two real servers of the random model, shared with the other tests of the group (a load is ~30
    CPU-seconds): the second is the one a test may kill, started again for the next test that asks."""
    return [shared_sglang("random", copy=0), shared_sglang("random", copy=1)]


def _server(fleet, worker: str = "w1") -> dict:
    """The worker's view of its one binding, as its last heartbeat published it (what `status` shows)."""
    found = [r for r in heartbeats.read_all(redis.Redis.from_url(fleet.redis_url))
             if r["worker"].startswith(f"{worker}@")]
    return found[0]["servers"][0] if found else {}


def _answered(gateway: Gateway) -> dict[str, int]:
    """How many requests each of the gateway's servers answered well (smg_worker_cb_outcomes_total, success)."""
    found = by_label(gateway.metrics, "smg_worker_cb_outcomes_total", "worker", outcome="success")
    return {url.rstrip("/"): int(value) for url, value in found.items()}


def _gateway_sent_again(gateway: Gateway) -> int:
    """Requests the gateway sent again after a failed try (smg_worker_retries_total, over its labels)."""
    return int(sum_of(gateway.metrics, "smg_worker_retries_total"))


def _retries(port: int) -> dict[str, int]:
    """The worker's requests tried again, by kind (fleet_retries_total): `transient` spend a prompt's
    FLEET_MAX_ATTEMPTS, `unavailable` (a server, or the gateway's upstream, lost) do not."""
    found = by_label(worker_page(port), "fleet_retries_total", "kind")
    return {kind: int(value) for kind, value in found.items()}


def _enqueue(fleet, tmp_path: Path, n: int, budget: int) -> None:
    """n prompts at temperature 0 with the bundled tokenizer, without thinking (random weights stop only at
    the budget, so `truncated` is not a fault here)."""
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--tokenizer", "bundled",
                   "--temperature", "0", "--max-new-tokens", str(budget), "--thinking", "off",
                   "--disable-rule", "truncated")


def test_through_the_real_gateway_every_prompt_is_stored_once_as_the_real_servers_answer(
        fleet, tmp_path, shared_sglang):
    # Given the real gateway (round-robin) in front of two real servers of the random model,
    # and a worker bound to the gateway's URL only
    first, second = _two_servers(shared_sglang)
    gateway = start_gateway(fleet.logs, [first.url, second.url], policy="round_robin")
    fleet.processes.append(gateway.process)
    fleet.worker("w1", [gateway.url])

    # When a run of 30 prompts is enqueued at temperature 0
    n, budget = 30, 12
    _enqueue(fleet, tmp_path, n, budget)

    # Then every prompt is stored exactly once, none dead-lettered
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    rows = fleet.rows()
    assert Counter(row["id"] for row in rows) == Counter(r["id"] for r in varied_prompts(n))
    assert {row["server"] for row in rows} == {gateway.url}
    # and each sample is the prompt's ids then exactly what a real server answers to them, asked directly
    for row in rows:
        prompt = row["input_ids"][:row["prompt_len"]]
        assert row["input_ids"][row["prompt_len"]:] == first.generate(prompt, max_new_tokens=budget,
                                                                       temperature=0)["output_ids"], row["id"]
        assert (row["finish_reason"], row["output_len"], row["attempts"]) == ("length", budget, 1)
    # and both servers did a share of the work: the gateway had each answer a third of the run's requests
    # or more (round-robin; the worker's one-token probes of an idle gateway count there too)
    answered = _answered(gateway)
    assert set(answered) == {first.url, second.url} and sum(answered.values()) >= n, answered
    assert all(count >= n // 3 for count in answered.values()), answered
    # and the worker read the real servers' context length and capacity through the gateway
    server = _server(fleet)
    assert (server["state"], server["max_model_len"], server["capacity"], server["gateway_workers"]) == \
        ("healthy", CONTEXT, 2 * CAPACITY, 2), server


@pytest.mark.parametrize("retries", [
    pytest.param(True, id="gateway-retries"),
    pytest.param(False, id="no-gateway-retries"),
])
def test_a_real_server_killed_behind_the_gateway_mid_run_costs_no_prompt(fleet, tmp_path, shared_sglang,
                                                                          retries: bool):
    # Given the real gateway (round-robin; retrying a failed request on another server, its default, or
    # not) in front of two real servers of the random model, and a worker bound to the gateway that keeps
    # 4 requests in flight (so that the run takes some seconds)
    first, second = _two_servers(shared_sglang)
    options = () if retries else ("--disable-retries",)
    gateway = start_gateway(fleet.logs, [first.url, second.url], *options, policy="round_robin")
    fleet.processes.append(gateway.process)
    metrics_port = free_port()
    worker = fleet.worker("w1", [gateway.url], FLEET_MAX_INFLIGHT_PER_SERVER="4", FLEET_METRICS_PORT=str(metrics_port))
    n, budget = 30, 64
    _enqueue(fleet, tmp_path, n, budget)

    # When one server is SIGKILLed (every process of it) mid-run, with requests in flight on it
    wait_until(lambda: fleet.states().get("done", 0) >= 5, 180, "a sixth of the run stored", fleet)
    assert fleet.states().get("queued", 0) > 0, "the run ended before the fault: longer generations are needed"
    second.kill()

    # Then every prompt is stored exactly once, through the other server, none dead-lettered (none of the
    # prompts in flight on the killed server is blamed for its death: it died of the test's hand)
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    rows = fleet.rows()
    assert Counter(row["id"] for row in rows) == Counter(r["id"] for r in varied_prompts(n))
    # and the kill cut requests in flight there: the gateway sent them again itself (more than it passed
    # on to the worker), or, without its retries, the worker did, on the gateway's own answer
    # (its upstream lost); either way the worker's tries again spend none of a prompt's
    # FLEET_MAX_ATTEMPTS, however often the gateway still picked the dead server before its health
    # checks dropped it
    assert f"worker_url={second.url} route=/generate" in gateway.process.log.read_text()
    attempts = Counter(row["attempts"] for row in rows)
    retried = _retries(metrics_port)
    if retries:
        # (its retries pick by round-robin, the dead server possibly again: a request whose every try met
        # it comes back as the gateway's last answer, which the worker sends again as an outage)
        spent = sum((tried - 1) * count for tried, count in attempts.items())
        sent_again = _gateway_sent_again(gateway)
        assert set(retried) <= {"unavailable"} and spent <= retried.get("unavailable", 0), (attempts, retried)
        assert retried.get("unavailable", 0) < sent_again, (attempts, retried, sent_again)
    else:
        assert attempts[1] < n and set(retried) == {"unavailable"}, (attempts, retried)
    # and each sample is still exactly the surviving server's own answer to its ids
    for row in rows:
        prompt = row["input_ids"][:row["prompt_len"]]
        assert row["input_ids"][row["prompt_len"]:] == first.generate(prompt, max_new_tokens=budget,
                                                                       temperature=0)["output_ids"], row["id"]
    # and the worker follows the gateway's list: one server left, its capacity alone
    wait_until(lambda: _server(fleet).get("gateway_workers") == 1, 60, "the gateway's list of one server", fleet)
    assert (_server(fleet)["state"], _server(fleet)["capacity"]) == ("healthy", CAPACITY)
    assert "was in flight on" not in worker.log.read_text()
