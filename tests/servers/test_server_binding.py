"""Workers bound to healthy, correctly configured SGLang servers."""
from __future__ import annotations

import signal

import httpx
import redis

from producer.local import free_port

from conftest import varied_prompts, write_prompts
from waiting import health_rounds, wait_until

QUEUE = "fleet.generate"
GATE_CLOSED = "consuming from nothing"  # the worker's log line when its gate closes


def _queue_untouched(fleet, n: int) -> bool:
    client = redis.Redis.from_url(fleet.redis_url)
    return client.llen(QUEUE) == n and client.hlen("unacked") == 0


def _health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_a_loading_then_warming_server_gets_work_only_once_healthy(fleet, tmp_path):
    # Given a server that keeps its port closed, then answers 503, then 200, and a worker bound to it
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fleet.worker("w1", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(40))))
    fleet.standin("--load-seconds", "4", "--warmup-seconds", "4", port=port, wait_healthy=False)

    # While it is not healthy, every prompt stays queued in Redis
    seen = set()

    def healthy_with_queue_untouched() -> bool:
        seen.add(status := _health(url))
        assert status == 200 or _queue_untouched(fleet, 40)
        return status == 200

    wait_until(healthy_with_queue_untouched, 30, "the server to become healthy", fleet, 0.3)
    assert {None, 503} <= seen

    # Once healthy it gets the work, and no prompt is lost or dead-lettered
    assert fleet.wait_finished() == {"done": 40}
    assert fleet.dead_letters() == []
    assert len(fleet.rows()) == 40


def test_a_worker_whose_only_server_is_down_takes_no_tasks_until_it_returns(fleet, tmp_path):
    # Given a worker whose only server was healthy, then died
    port = free_port()
    server, url = fleet.standin(port=port)
    worker = fleet.worker("w1", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "a.jsonl", varied_prompts(5, "a"))))
    fleet.wait_finished()
    closed_before = worker.tail(10_000).count(GATE_CLOSED)
    server.signal(signal.SIGKILL)
    wait_until(lambda: worker.tail(10_000).count(GATE_CLOSED) > closed_before, 30, "w1 to stop consuming")

    # When prompts are enqueued while it is down (as the worker sees it)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "b.jsonl", varied_prompts(30, "b"))))

    # Then, for three rounds of health checks more, the worker takes none of them: they stay queued in Redis
    health_rounds(fleet.redis_url, 3, fleet=fleet)
    assert _queue_untouched(fleet, 30)
    assert worker.alive()

    # When the server comes back, the worker finishes them all
    fleet.standin(port=port)
    assert fleet.wait_finished() == {"done": 35}
    assert fleet.dead_letters() == []


def test_only_servers_of_the_runs_model_get_its_prompts(fleet, tmp_path):
    # Given a worker bound to four servers: the right model, a wrong model, the right model with a
    # reasoning parser, and the right model with auto-truncation (which would cut prompts silently)
    model = "deepseek-ai/DeepSeek-R1"
    _, right = fleet.standin("--model-path", model)
    _, wrong = fleet.standin("--model-path", "meta-llama/Llama-3.1-8B-Instruct")
    _, parser = fleet.standin("--model-path", model, "--reasoning-parser", "deepseek-r1")
    _, truncating = fleet.standin("--model-path", model, "--allow-auto-truncate")
    worker = fleet.worker("w1", [right, wrong, parser, truncating])

    # When a run names the model
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(80))),
                   "--served-model", model)
    assert fleet.wait_finished() == {"done": 80}

    # Then none of the dataset comes from the wrong or the truncating server, while the
    # server with a reasoning parser keeps serving
    servers = {row["server"] for row in fleet.rows()}
    assert servers == {right, parser}
    for url in (wrong, truncating):
        assert httpx.get(f"{url}/standin/stats").json()["requests"] == 0
    log = worker.log.read_text()
    assert "REFUSED" in log and "allow_auto_truncate" in log


def test_killing_a_server_mid_run_loses_nothing(fleet, tmp_path):
    # Given two slow servers and a worker bound to both
    slow = ("--step-base", "0.01")
    doomed, url_a = fleet.standin(*slow)
    _, url_b = fleet.standin(*slow)
    fleet.worker("w1", [url_a, url_b])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(150))))

    # When one server is killed while prompts are in flight on it
    wait_until(lambda: fleet.states().get("done", 0) >= 20, 60, "first samples", fleet)
    assert httpx.get(f"{url_a}/standin/stats").json()["running"] > 0
    doomed.signal(signal.SIGKILL)

    # Then every prompt is still stored, none dead-lettered, the rest by the surviving server
    assert fleet.wait_finished() == {"done": 150}
    assert fleet.dead_letters() == []
    rows = fleet.rows()
    assert sorted(r["id"] for r in rows) == sorted(f"p-{i:04d}" for i in range(150))
    assert any(r["server"] == url_b and r["attempts"] >= 2 for r in rows)
