"""A worker's task events go out in batches every `FLEET_TASK_EVENTS_INTERVAL`, and its last
batch on shutdown (`workers/reporting/events.py`), read as Flower reads them: Celery's event
channel, each message one event or a `task.multi` list of them."""
from __future__ import annotations

import base64
import json
import threading

import redis

from producer.local import wait_for

from conftest import varied_prompts, write_prompts


class Events:
    """Every Celery event published on the fleet's Redis, in the order it arrived."""

    def __init__(self, url: str):
        self.seen: list[dict] = []
        self._lock = threading.Lock()
        self.pubsub = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(**{"*celeryev*": self._on})
        self.thread = self.pubsub.run_in_thread(sleep_time=0.05, daemon=True)

    def _on(self, message) -> None:
        envelope = json.loads(message["data"])
        body = envelope["body"]
        if envelope["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        found = json.loads(body)
        with self._lock:
            self.seen.extend(found if isinstance(found, list) else [found])

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(event["type"] == kind for event in self.seen)

    def close(self) -> None:
        self.thread.stop()  # its loop closes the subscription as it ends
        self.thread.join(5)


def test_task_events_wait_for_their_interval_and_a_stopping_worker_sends_those_it_holds(fleet, tmp_path):
    # Given a worker whose task events flush once an hour, and a listener on Celery's event channel
    events = Events(fleet.redis_url)
    try:
        _, server = fleet.standin()
        worker = fleet.worker("w1", [server], FLEET_TASK_EVENTS_INTERVAL="3600")
        wait_for(lambda: events.count("worker-online") == 1, 60, "the worker online", worker)

        # When it generates 3 prompts
        fleet.producer("enqueue", str(write_prompts(tmp_path / "prompts.jsonl", varied_prompts(3))))
        assert fleet.wait_finished() == {"done": 3}
        # Then two of its worker-heartbeat events (sent at once, every 10 s) come, but none of its task events
        beats = events.count("worker-heartbeat")
        wait_for(lambda: events.count("worker-heartbeat") >= beats + 2, 60, "two worker heartbeats", worker)
        assert events.count("task-succeeded") == events.count("task-received") == 0

        # When it stops
        assert worker.stop(timeout=60) == 0
        # Then it sent what it held: every task's events, in one batch before it went offline
        wait_for(lambda: events.count("worker-offline") == 1, 30, "the worker offline")
        assert events.count("task-received") == events.count("task-started") == events.count("task-succeeded") == 3
    finally:
        events.close()
