"""Workers bound to SGLang's real gateway (sglang-router from the package index) in front of stand-ins.

The gateway answers none of the preflight's routes for its servers, counts a
server's 400s as failures of that server and opens its circuit breakers on
them, and answers `503 No available workers` while its `/readiness` still says
ready. So the worker reads each server the gateway lists, cuts every budget to
fit the smallest context, and treats the gateway's own outage answer as an
outage of the binding: no prompt spends an attempt or is dead-lettered for it.
"""
from __future__ import annotations

import signal
import time
from collections import Counter

import httpx
import redis

from contract.fleet import heartbeats

from conftest import varied_prompts, write_prompts
from info_relay import InfoRelay
from real_gateway import start_gateway
from waiting import health_rounds, wait_until

CONTEXT = 2048


def _server(fleet, worker: str = "w1") -> dict:
    """The worker's view of its one binding, as its last heartbeat published it (what `status` shows);
    empty before its first heartbeat."""
    found = [r for r in heartbeats.read_all(redis.Redis.from_url(fleet.redis_url))
             if r["worker"].startswith(f"{worker}@")]
    return found[0]["servers"][0] if found else {}


def test_through_the_gateway_every_budget_fits_the_servers_context_and_no_circuit_opens(fleet, tmp_path):
    # Given the real gateway (cache-aware) in front of two servers of a 2,048-token context
    backends = [fleet.standin("--context-length", str(CONTEXT), "--max-running-requests", str(n))[1]
                for n in (8, 16)]
    gateway = start_gateway(fleet.logs, backends)
    fleet.processes.append(gateway.process)
    fleet.worker("w1", [gateway.url])

    # When a run asks for budgets of 4,096 tokens, more than any prompt's room
    n = 40
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--max-new-tokens", "4096")

    # Then every prompt is stored, through the gateway, on both servers
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    rows = fleet.rows()
    assert len({row["id"] for row in rows}) == n and {row["server"] for row in rows} == {gateway.url}
    assert all(httpx.get(f"{b}/standin/stats", timeout=5).json()["tokens_generated"] > 0 for b in backends)
    # with each budget cut to what SGLang answers at most (context - 2 - prompt), at the first attempt
    assert all(row["max_new_tokens"] == CONTEXT - row["prompt_len"] - 2 for row in rows)
    assert {row["attempts"] for row in rows} == {1}
    # and the gateway's circuit breakers never opened
    assert gateway.circuits_opened() == 0
    # and the worker read the context length and capacity from the servers themselves
    server = _server(fleet)
    assert (server["state"], server["max_model_len"], server["capacity"], server["gateway_workers"]) == \
        ("healthy", CONTEXT, 24, 2)


def _round_robin_run(fleet, tmp_path, *gateway_args: str, running: int):
    """Two servers with generations of about a second behind the real gateway (round-robin), a
    worker bound to the gateway, and 60 prompts enqueued; the first server's process, and n."""
    first_process, _, n = _gateway_run(fleet, tmp_path, *gateway_args, running=running)
    return first_process, n


def _gateway_run(fleet, tmp_path, *gateway_args: str, running: int):
    """`_round_robin_run`'s run; the first server's process, the gateway and n."""
    slow = ("--max-running-requests", str(running), "--step-base", "0.01", "--output-len-median", "80",
            "--output-len-max", "120")
    first_process, first = fleet.standin(*slow)
    _, second = fleet.standin(*slow)
    gateway = start_gateway(fleet.logs, [first, second], *gateway_args, policy="round_robin")
    fleet.processes.append(gateway.process)
    fleet.worker("w1", [gateway.url])
    n = 60
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))))
    return first_process, gateway, n


def test_the_gateway_itself_killed_and_restarted_mid_run_loses_no_prompt(fleet, tmp_path):
    # Given the real gateway (round-robin) in front of two servers, with generations of about a second
    _, gateway, n = _gateway_run(fleet, tmp_path, running=4)

    # When the gateway is SIGKILLed mid-run, with prompts in flight through it, and a supervisor
    # starts it again on its port some seconds later
    wait_until(lambda: fleet.states().get("done", 0) >= 10, 120, "a sixth of the run stored", fleet)
    assert fleet.states().get("queued", 0) > 0, "the run ended before the fault: slower answers are needed"
    gateway.process.signal(signal.SIGKILL)
    time.sleep(5)
    port = int(gateway.url.rsplit(":", 1)[1])
    fleet.processes.append(start_gateway(fleet.logs, gateway.workers, policy="round_robin", port=port).process)

    # Then every prompt is stored all the same, each once, none dead-lettered
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    assert set(Counter(row["id"] for row in fleet.rows()).values()) == {1} and len(fleet.rows()) == n


def test_the_gateway_itself_frozen_mid_run_loses_no_prompt(fleet, tmp_path):
    # Given the real gateway (round-robin) in front of two servers, with generations of about a second
    _, gateway, n = _gateway_run(fleet, tmp_path, running=4)

    # When the gateway freezes mid-run (SIGSTOP: its port open, nothing answered) until the worker
    # has noticed, then resumes
    wait_until(lambda: fleet.states().get("done", 0) >= 10, 120, "a sixth of the run stored", fleet)
    assert fleet.states().get("queued", 0) > 0, "the run ended before the fault: slower answers are needed"
    gateway.process.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _server(fleet).get("state") not in (None, "healthy"), 60,
                   "the worker to see its gateway unhealthy", fleet)
    finally:
        gateway.process.signal(signal.SIGCONT)

    # Then every prompt is stored all the same, each once, none dead-lettered
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    assert set(Counter(row["id"] for row in fleet.rows()).values()) == {1} and len(fleet.rows()) == n


def test_a_server_killed_behind_a_round_robin_gateway_loses_no_prompt(fleet, tmp_path):
    # Given the real gateway (round-robin) in front of two servers, with generations of about a second
    victim, n = _round_robin_run(fleet, tmp_path, running=16)

    # When one server is SIGKILLed mid-run
    wait_until(lambda: fleet.states().get("done", 0) >= 10, 120, "a sixth of the run stored", fleet)
    victim.signal(signal.SIGKILL)

    # Then every prompt is stored all the same, none dead-lettered
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    assert len({row["id"] for row in fleet.rows()}) == n
    # and the worker follows the gateway's list: one server left, its capacity alone
    wait_until(lambda: _server(fleet)["gateway_workers"] == 1, 60, "the gateway's list of one server", fleet)
    assert _server(fleet)["capacity"] == 16


def test_a_server_frozen_behind_a_gateway_with_a_request_timeout_loses_no_prompt(fleet, tmp_path):
    # Given the real gateway (round-robin) with a 10 s request timeout in front of two servers, with
    # generations of about a second
    frozen, n = _round_robin_run(fleet, tmp_path, "--request-timeout-secs", "10", running=8)

    # When one server freezes mid-run (SIGSTOP: its port open, nothing answered)
    wait_until(lambda: fleet.states().get("done", 0) >= 10, 120, "a sixth of the run stored", fleet)
    frozen.signal(signal.SIGSTOP)
    try:
        # Then every prompt is stored all the same, none dead-lettered
        assert fleet.wait_finished(timeout=300) == {"done": n}
        assert fleet.dead_letters() == []
        assert len({row["id"] for row in fleet.rows()}) == n
    finally:
        frozen.signal(signal.SIGCONT)


def test_a_gateway_that_is_ready_but_refuses_every_request_pauses_the_worker_and_no_prompt_dies(fleet, tmp_path):
    # Given the real gateway in front of two servers, one refused request enough to open a circuit
    # (the worker's own probes, all good, would otherwise break a run of ten), which half-opens 8 s
    # later, and an idle worker bound to it
    backends = [fleet.standin("--context-length", str(CONTEXT))[1] for _ in range(2)]
    gateway = start_gateway(fleet.logs, backends, "--cb-failure-threshold", "1", "--cb-timeout-duration-secs", "8")
    fleet.processes.append(gateway.process)
    fleet.worker("w1", [gateway.url])
    wait_until(lambda: _server(fleet).get("state") == "healthy", 60, "the gateway ready for the worker", fleet)

    # When another client's refused requests open every circuit (the gateway answers 503 No available
    # workers, while its /readiness still says ready)
    gateway.open_circuits()
    assert httpx.get(f"{gateway.url}/readiness", timeout=5).status_code == 200

    # Then the worker's health notices within its rounds: the gateway is down to it
    wait_until(lambda: _server(fleet).get("state") == "down", 30, "the gateway seen as down", fleet)

    # When prompts come meanwhile
    n = 30
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--max-new-tokens", "4096")

    # Then, once the circuits close again, every prompt is stored at its first attempt: none spent an
    # attempt on the outage, none was dead-lettered
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    assert {row["attempts"] for row in fleet.rows()} == {1}
    assert _server(fleet).get("state") == "healthy"


def test_circuits_that_open_mid_run_pause_the_worker_and_no_prompt_spends_an_attempt(fleet, tmp_path):
    # Given the real gateway in front of two servers, one refused request enough to open a circuit,
    # which half-opens 6 s later, and a worker busy with a run of ~1 s generations through it, 8 at a time
    slow = ("--max-running-requests", "4", "--step-base", "0.01", "--output-len-median", "80",
            "--output-len-max", "120")
    backends = [fleet.standin(*slow)[1] for _ in range(2)]
    gateway = start_gateway(fleet.logs, backends, "--cb-failure-threshold", "1", "--cb-timeout-duration-secs", "6")
    fleet.processes.append(gateway.process)
    worker = fleet.worker("w1", [gateway.url])
    n = 60
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))))
    wait_until(lambda: fleet.states().get("done", 0) >= 5, 120, "the run under way", fleet)

    # When another client's refused requests open every circuit while the worker's requests are in flight
    gateway.open_circuits()

    # Then the worker pauses the gateway on its outage answer, and once the circuits close every
    # prompt is stored at its first attempt, none dead-lettered
    assert fleet.wait_finished(timeout=300) == {"done": n}
    assert fleet.dead_letters() == []
    assert {row["attempts"] for row in fleet.rows()} == {1}
    assert "No available workers" in worker.log.read_text() and gateway.circuits_opened() >= 2


def test_a_gateway_in_front_of_a_server_that_truncates_prompts_is_refused(fleet, tmp_path):
    # Given the real gateway in front of a server and one started with --allow-auto-truncate
    _, plain = fleet.standin()
    _, truncating = fleet.standin("--allow-auto-truncate")
    gateway = start_gateway(fleet.logs, [plain, truncating])
    fleet.processes.append(gateway.process)

    # When a worker bound to the gateway has prompts to do
    worker = fleet.worker("w1", [gateway.url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(10))))

    # Then it refuses the gateway, naming the server and why, and takes no prompt for three rounds
    wait_until(lambda: _server(fleet).get("state") == "refused", 60, "the gateway refused", fleet)
    assert truncating in _server(fleet)["refusal"] and "allow_auto_truncate" in _server(fleet)["refusal"]
    health_rounds(fleet.redis_url, 3, fleet=fleet)
    client = redis.Redis.from_url(fleet.redis_url)
    assert client.llen("fleet.generate") == 10 and client.hlen("unacked") == 0
    assert worker.alive()


def test_servers_the_worker_cannot_read_refuse_the_gateway_unless_a_setting_gives_their_context(fleet, tmp_path):
    # Given the real gateway in front of two servers of a 2,048-token context that it reaches and the
    # worker does not (their info routes are cut off on the worker's way)
    relays = []
    for _ in range(2):
        process, url = fleet.standin("--context-length", str(CONTEXT))
        relays.append(InfoRelay(int(url.rsplit(":", 1)[1])))
    gateway = start_gateway(fleet.logs, [relay.url for relay in relays])
    fleet.processes.append(gateway.process)
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(20))
    fleet.producer("enqueue", str(prompts), "--max-new-tokens", "4096")

    # When a worker with every setting at its default is bound to the gateway
    worker = fleet.worker("w1", [gateway.url])

    # Then it takes no prompt, and says once what it could not read and how to fix it
    wait_until(lambda: "could not read" in (_server(fleet).get("refusal") or ""), 60, "the gateway refused", fleet)
    health_rounds(fleet.redis_url, 3, fleet=fleet)
    client = redis.Redis.from_url(fleet.redis_url)
    assert client.llen("fleet.generate") == 20 and client.hlen("unacked") == 0
    (line,) = [x for x in worker.log.read_text().splitlines() if "gets no prompt" in x]
    assert relays[0].url in line and "FLEET_CONTEXT_LENGTH" in line

    # When it is restarted with FLEET_CONTEXT_LENGTH, the servers' --context-length
    worker.stop()
    fleet.worker("w2", [gateway.url], FLEET_CONTEXT_LENGTH=str(CONTEXT))

    # Then every prompt is stored with its budget cut to fit, and no circuit opened
    assert fleet.wait_finished(timeout=300) == {"done": 20}
    assert all(row["max_new_tokens"] == CONTEXT - row["prompt_len"] - 2 for row in fleet.rows())
    assert gateway.circuits_opened() == 0
    for relay in relays:
        relay.close()
