"""The worker's connections to its servers: a host that vanishes, idle connections the server
closes, and a server whose certificate a private CA signed.

Real processes throughout: stand-ins, a worker, Redis, the producer. What a
user checks: every prompt stored and none dead-lettered; the worker's
`fleet_retries_total` by kind (`transient` spends a prompt's
`FLEET_MAX_ATTEMPTS`, `unavailable` does not); the binding's state and
refusal as its heartbeat publishes them (what `status` shows).
"""
from __future__ import annotations

import re
import ssl
import time

import httpx
import redis

from blackhole import BlackHole
from conftest import varied_prompts, write_prompts
from contract.fleet import heartbeats
from metric_pages import by_label, worker_page
from private_ca import make_ca
from producer.local import free_port
from waiting import wait_until

SHORT = ["--output-len-max", "48"]  # under the prompts' --max-new-tokens 64: never truncated


def _retries(port: int) -> dict[str, int]:
    """The worker's requests tried again, by kind (fleet_retries_total)."""
    found = by_label(worker_page(port), "fleet_retries_total", "kind")
    return {kind: int(value) for kind, value in found.items()}


def _servers(fleet, worker: str = "w1") -> list[dict]:
    """The worker's view of its bindings, as its last heartbeat published it."""
    found = [r for r in heartbeats.read_all(redis.Redis.from_url(fleet.redis_url))
             if r["worker"].startswith(f"{worker}@")]
    return found[0]["servers"] if found else []


def _enqueue(fleet, tmp_path, records, name: str = "p.jsonl") -> None:
    fleet.producer("enqueue", str(write_prompts(tmp_path / name, records)), "--max-new-tokens", "64")


def _running(url: str) -> int:
    """Requests the stand-in at `url` is generating now (its /v1/loads, read past any proxy)."""
    return httpx.get(f"{url}/v1/loads", timeout=5).json()["loads"][0]["num_running_reqs"]


def test_a_server_whose_host_vanishes_mid_run_costs_no_prompt_an_attempt(fleet, tmp_path):
    # Given two servers, one of them reached through a link whose host can vanish, and a worker
    # sending a run of 300 prompts to both (each answer takes about a second)
    _, far = fleet.standin(*SHORT, "--step-base", "0.02")
    _, near = fleet.standin(*SHORT, "--step-base", "0.02")
    hole = BlackHole(int(far.rsplit(":", 1)[1]))
    metrics = free_port()
    try:
        worker = fleet.worker("w1", [hole.url, near], FLEET_METRICS_PORT=str(metrics), FLEET_CONNECT_TIMEOUT="2",
                              FLEET_HEALTH_TIMEOUT="2", FLEET_MAX_INFLIGHT_PER_SERVER="16")
        _enqueue(fleet, tmp_path, varied_prompts(300))

        # When the far host vanishes while it is generating some of them (its open connections
        # hang, new ones time out), read on the server itself so the premise holds by construction
        # (vanishing before any request went there tested only the health checks: under load they
        # marked it down before the worker sent anything)
        wait_until(lambda: _running(far) >= 4, 120, "requests running on the far server", fleet, poll=0.05)
        hole.vanish()
        fleet.wait_finished(timeout=300)

        # Then every prompt is stored, none dead-lettered, and no prompt spent an attempt on the
        # vanished host: the requests it held were cut once it was marked down, new ones that found
        # no connection were its outage (`unavailable`), never `transient`
        assert fleet.dead_letters() == [] and fleet.states() == {"done": 300}
        retried = _retries(metrics)
        assert "transient" not in retried, retried
        log = worker.log.read_text()
        cut = re.search(r"(\d+) requests? in flight there cut", log)
        assert cut and int(cut.group(1)) > 0, (retried, fleet.logs_tail())
        # and the worker saw the far server go down; each prompt is stored once
        wait_until(lambda: any(s["url"] == hole.url and s["state"] != "healthy" for s in _servers(fleet)), 30,
                   "the far server marked down", fleet)
        assert sorted(r["id"] for r in fleet.rows()) == [f"p-{i:04d}" for i in range(300)]
    finally:
        hole.close()


def test_a_server_that_closes_idle_connections_after_a_second_is_never_taken_for_down(fleet, tmp_path):
    # Given a server that closes a connection idle for 1 s (uvicorn's default is 5 s), and a worker
    # that keeps idle connections up to 4 s (its default)
    _, url = fleet.standin(*SHORT, "--timeout-keep-alive", "1")
    metrics = free_port()
    fleet.worker("w1", [url], FLEET_METRICS_PORT=str(metrics))

    # When prompts come in bursts, each after the last burst's connections sat idle about a second
    done = 0
    for burst in range(8):
        _enqueue(fleet, tmp_path, varied_prompts(24, prefix=f"b{burst}"), f"b{burst}.jsonl")
        done += 24
        wait_until(lambda: fleet.states().get("done", 0) >= done, 120, f"burst {burst} stored", fleet, poll=0.05)
        time.sleep(0.9 + 0.05 * burst)

    # Then every prompt is stored on its first request: no request was taken for the server being
    # unavailable, none retried, the server never marked anything but healthy
    assert fleet.states() == {"done": done} and fleet.dead_letters() == []
    assert {r["attempts"] for r in fleet.rows()} == {1}
    assert _retries(metrics) == {}, fleet.logs_tail()
    assert [s["state"] for s in _servers(fleet)] == ["healthy"]


def _https_standin(fleet, ca) -> str:
    process, _ = fleet.standin(*SHORT, "--ssl-certfile", str(ca.cert), "--ssl-keyfile", str(ca.key),
                               port=(port := free_port()), wait_healthy=False)
    url = f"https://localhost:{port}"
    trust = ssl.create_default_context(cafile=str(ca.ca))

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", verify=trust, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False
    wait_until(healthy, 60, "the HTTPS stand-in", fleet)
    return url


def test_a_server_signed_by_a_private_ca_is_used_once_its_ca_is_trusted(fleet, tmp_path):
    # Given a server whose certificate a private CA signed, and that CA in the bundle SSL_CERT_FILE names
    ca = make_ca(tmp_path / "ca")
    url = _https_standin(fleet, ca)
    _enqueue(fleet, tmp_path, varied_prompts(40))

    # When a worker bound to it starts with SSL_CERT_FILE pointing at the CA
    fleet.worker("w1", [url], SSL_CERT_FILE=str(ca.ca))
    fleet.wait_finished(timeout=120)

    # Then its health checks and preflight pass and every prompt is generated there
    assert fleet.dead_letters() == [] and fleet.states() == {"done": 40}
    assert {r["server"] for r in fleet.rows()} == {url}
    assert [s["state"] for s in _servers(fleet)] == ["healthy"]


def test_a_server_whose_certificate_is_not_trusted_is_refused_with_the_reason(fleet, tmp_path):
    # Given the same server, and a worker that trusts the system's store only
    ca = make_ca(tmp_path / "ca")
    url = _https_standin(fleet, ca)
    _enqueue(fleet, tmp_path, varied_prompts(5))
    system = ssl.get_default_verify_paths()

    # When the worker starts
    fleet.worker("w1", [url], SSL_CERT_FILE=system.cafile or system.openssl_cafile)

    # Then the server is refused, and the refusal says why and what to do; no prompt is generated
    wait_until(lambda: [s.get("state") for s in _servers(fleet)] == ["refused"], 60, "the server refused", fleet)
    refusal = _servers(fleet)[0]["refusal"]
    assert "certificate is not trusted" in refusal and "SSL_CERT_FILE" in refusal, refusal
    assert fleet.states() == {"queued": 5}
