"""Watching a run: status, worker metrics, and secrets kept out of sight."""
from __future__ import annotations

import json

import httpx

from producer.local import free_port, redis_server_binary, spawn, wait_for

from conftest import varied_prompts, write_prompts
from waiting import wait_until


def test_status_reports_counts_rates_servers_and_workers(fleet, tmp_path):
    # Given a worker bound to a healthy server and a dead one, and a finished run with a dead letter
    _, url = fleet.standin("--fault-missing-think-end", "0.2")
    dead_server = f"http://127.0.0.1:{free_port()}"
    fleet.worker("w1", [url, dead_server])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(30))))
    states = fleet.wait_finished()

    # When status is asked for as JSON
    report = json.loads(fleet.producer("status", "--json").stdout)

    # Then it counts every prompt, with rates, and shows each server as the worker sees it
    assert report["prompts"] == 30 and report["done"] == states["done"] and report["dead"] == states["dead"]
    assert report["dead_by_reason"] == {"missing_think_end": states["dead"]}
    assert report["finished"] and report["queued"] == 0 and report["in_flight"] == 0
    assert report["samples_per_s"] > 0 and report["tokens_per_s"] > 0
    (worker,) = report["workers"]
    assert worker["worker"].startswith("w1@") and worker["seen_s_ago"] < 30
    servers = {s["url"]: s for s in worker["servers"]}
    # (a server never seen up is `loading` for its start grace, then `down`: a slow run may pass the grace)
    assert servers[url]["state"] == "healthy" and servers[dead_server]["state"] in ("loading", "down")
    # and the table form says the same to a person
    table = fleet.producer("status").stdout
    assert "missing_think_end" in table and "healthy" in table and "loading" in table


def test_worker_metrics_show_prompts_tokens_servers_and_queue(fleet, tmp_path):
    # Given a worker serving metrics on a known port, after a run with dead letters
    _, url = fleet.standin("--fault-empty-answer", "0.2")
    port = free_port()
    fleet.worker("w1", [url], FLEET_METRICS_PORT=str(port))
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(30))))
    states = fleet.wait_finished()

    # When Prometheus scrapes it
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text

    # Then it shows what the fleet did and where things stand
    assert f'fleet_prompts_total{{outcome="stored",run="default"}} {float(states["done"])}' in text
    assert f'fleet_dead_letters_total{{reason="empty_answer"}} {float(states["dead"])}' in text
    assert f'fleet_server_up{{server="{url}"}} 1.0' in text
    assert 'fleet_queue_depth{queue="fleet.generate"} 0.0' in text
    assert 'fleet_dead_letter_depth{run="default"}' in text
    assert "fleet_generation_seconds_bucket" in text and "fleet_shard_commits_total" in text


def test_the_api_key_is_sent_as_a_bearer_token_and_never_logged(fleet, tmp_path):
    # Given a server that requires an API key, and a worker that has it
    _, url = fleet.standin("--api-key", "sk-topsecret-123")
    worker = fleet.worker("w1", [url], SGLANG_API_KEY="sk-topsecret-123")

    # When prompts are generated
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(10))))

    # Then the server accepted them, and the key appears nowhere in the worker's log or status
    assert fleet.wait_finished() == {"done": 10}
    assert "sk-topsecret-123" not in worker.log.read_text()
    assert "sk-topsecret-123" not in fleet.producer("status", "--json").stdout


def test_a_redis_password_stays_out_of_logs_and_status(fleet, tmp_path):
    # Given a Redis server with a password, passed only in REDIS_URL
    port = free_port()
    redis_server = spawn(f"redis-auth-{port}", [redis_server_binary(), "--port", str(port), "--save", "",
                                                "--requirepass", "pw-hunter2"], fleet.logs)
    fleet.processes.append(redis_server)
    fleet.redis_url = f"redis://:pw-hunter2@127.0.0.1:{port}/0"
    wait_for(lambda: __import__("redis").Redis.from_url(fleet.redis_url).ping(), 20, "redis")
    _, url = fleet.standin()
    worker = fleet.worker("w1", [url])

    # When a run goes through
    enqueue = fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(5))))
    assert fleet.wait_finished() == {"done": 5}

    # Then the password is in no log line and no output
    status = fleet.producer("status")
    for text in (worker.log.read_text(), enqueue.stdout, enqueue.stderr, status.stdout, status.stderr):
        assert "pw-hunter2" not in text


def test_a_pickled_message_is_refused_by_the_worker(fleet, tmp_path):
    # Given a worker, and a prompt enqueued normally
    _, url = fleet.standin()
    worker = fleet.worker("w1", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(1))))
    fleet.wait_finished()

    # When someone publishes a pickle-serialized task onto the queue
    from kombu import Connection

    with Connection(fleet.redis_url) as connection:
        producer = connection.Producer(serializer="pickle")
        producer.publish({"task": "fleet.generate"}, routing_key="fleet.generate",
                         headers={"task": "fleet.generate", "id": "default:evil"})

    # Then the worker refuses to deserialize it
    def refused() -> bool:
        return "content of type pickle" in worker.log.read_text()

    wait_until(refused, 30, "refusal in the worker log", fleet)

    # and runs nothing for it: once a prompt enqueued after it is stored, the server has had
    # exactly one request per real prompt, and the worker is still up
    fleet.producer("enqueue", str(write_prompts(tmp_path / "q.jsonl", varied_prompts(1, "q"))))
    assert fleet.wait_finished() == {"done": 2}
    assert httpx.get(f"{url}/standin/stats").json()["requests"] == 2
    assert worker.alive()
