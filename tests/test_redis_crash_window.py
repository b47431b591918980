"""A Redis crash between kombu's take of a message and its record never starts a prompt twice.

kombu's Redis transport takes a message off its queue (BRPOP) and then, in a
second command, records it as unacknowledged. With `appendfsync always` a
crash in between keeps the take and loses the record: the message is in
neither the queue nor the unacknowledged hash, and the lost-message audit
republishes its prompt. A worker that sends its record late (frozen, or held
by the network, then reconnected to the restarted Redis) would then start the
prompt beside the worker that took the republished message.

The window is held open from outside: worker w1 talks to Redis through a proxy
(`netfault.py`) that holds everything w1 sends once a BRPOP reply carrying a
message reached it. Redis is SIGKILLed there, restarted from its AOF, w2 takes
the republished prompt, and the proxy lets w1's record through while w2
generates.
"""
from __future__ import annotations

from collections import Counter

import httpx
import redis

from contract.broker import kombu_redis
from contract.keys import RunKeys
from producer.local import free_port, start_redis

from conftest import wait_until, write_prompts
from netfault import NetFault

ENV = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1", "FLEET_AUDIT_INTERVAL": "2"}


def _generations(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]


def _consuming(client: redis.Redis) -> int:
    return sum(1 for c in client.client_list() if c.get("cmd") == "brpop")


def _crash_in_the_window(fleet, tmp_path, lines: list[dict], *enqueue: str) -> tuple[str, str]:
    """Redis killed while w1 holds the first message taken but not recorded; w2 generating its
    prompt once Redis is back. Returns (the stand-in's URL, the prompt id)."""
    _, url = fleet.standin("--fault-slow", "1", "--slow-seconds", "12")
    data, port = tmp_path / "redis-data", free_port()
    broker, fleet.redis_url = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True)
    fleet.processes.append(broker)
    proxy = NetFault(port)
    fleet.worker("w1", [url], REDIS_URL=proxy.url, **ENV)
    wait_until(lambda: _consuming(redis.Redis.from_url(fleet.redis_url)) >= 1, 90, "w1 consuming", fleet)
    proxy.hold_after_next_message()
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", lines)), *enqueue)
    assert proxy.message_held.wait(60), "w1 never took the message"

    # When Redis is SIGKILLed there and restarts from its append-only file
    broker.kill()
    broker, _ = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True)
    fleet.processes.append(broker)
    client = redis.Redis.from_url(fleet.redis_url)
    (prompt_id,) = [k.decode() for k in client.hkeys(RunKeys("default").token_ids)]
    assert client.hlen(kombu_redis.UNACKED) == 0  # taken, never recorded

    # and w2 takes the prompt the audit republishes, and w1's record goes through while w2 generates it
    fleet.worker("w2", [url], **ENV)
    wait_until(lambda: _generations(url).get(prompt_id) == 1, 120, "w2 generating the republished prompt", fleet)
    proxy.release()
    return url, prompt_id


def test_a_redis_crash_between_take_and_record_never_starts_a_prompt_twice(fleet, tmp_path):
    # Given one long prompt, taken by w1 just before Redis crashes
    url, prompt_id = _crash_in_the_window(fleet, tmp_path, [{"id": "p-0000", "prompt": "What is 6 * 7?"}])

    # Then it is generated once, stored once, and nothing stays in flight
    assert fleet.wait_finished(timeout=180) == {"done": 1}
    assert _generations(url) == {prompt_id: 1}
    assert Counter(r["id"] for r in fleet.rows()) == {prompt_id: 1}
    assert fleet.dead_letters() == []
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: client.hlen(kombu_redis.UNACKED) == 0, 60, "every delivery acknowledged", fleet)
    assert client.hlen(RunKeys("default").deliveries) == 0


def test_a_redis_crash_between_take_and_record_never_starts_a_conversation_turn_twice(fleet, tmp_path):
    # Given one conversation of two user turns, regenerated turn by turn; its first turn taken by w1
    # just before Redis crashes
    messages = [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
                {"role": "user", "content": "And another?"}]
    url, first = _crash_in_the_window(fleet, tmp_path, [{"id": "c-0000", "messages": messages}],
                                      "--turns", "all")

    # Then each turn is generated once and stored once, and the conversation completes
    wait_until(lambda: fleet.states() == {"done": 2}, 240, "both turns stored", fleet)
    generations = _generations(url)
    assert sorted(generations.values()) == [1, 1] and generations[first] == 1
    assert sorted(Counter(r["id"] for r in fleet.rows()).values()) == [1, 1]
    assert fleet.dead_letters() == []
