"""Intakes asked together go in one round trip, each task getting its own reply
(`workers/intake/group_intake.py`). A real redis-server, the fleet's own kind of client."""
from __future__ import annotations

import threading
from collections import Counter

import pytest
import redis

from bench.fleet_nodes import CountedConnection, counting_for
from contract.redis_link import replication
from contract.ledger.codec import pack_ids
from contract.redis_link.connections import BlockingPool
from contract.ledger.ledger import Ledger
from workers.intake import deliveries
from workers.intake.group_intake import for_client

SENT: Counter = Counter()  # requests sent, by first command (every thread of a spec counts here)


@pytest.fixture(autouse=True)
def plain_redis(monkeypatch):
    """What this process saw of primaries starts empty: a plain Redis without replicas."""
    for name in ("_had", "_short_since", "_attached_to", "_looked"):
        monkeypatch.setattr(replication, name, {})
    monkeypatch.setattr(replication, "_last_replicas", [0])
    SENT.clear()
    counting_for(SENT)


@pytest.fixture
def fleet_client(server, client):
    """A worker's kind of client (scripts loaded on connect), its requests counted (the bench's
    counted connection)."""
    return redis.Redis(connection_pool=BlockingPool.from_url(server, connection_class=CountedConnection,
                                                              max_connections=2))


def _queued(client: redis.Redis, run: str, *prompt_ids: str) -> None:
    Ledger(client, run).enqueue({pid: pack_ids([int(pid[1:]), 7]) for pid in prompt_ids})


def _ask_at_once(client: redis.Redis, asks: list[tuple[str, str]], worker: str = "w1") -> dict:
    """Each (run, prompt) taken in by its own thread, all started together; (run, prompt) -> the
    intake or the error it got."""
    got, start = {}, threading.Barrier(len(asks))

    def one(run: str, prompt_id: str) -> None:
        counting_for(SENT)
        start.wait()
        try:
            got[(run, prompt_id)] = for_client(client).take(client, run, prompt_id, worker, 5)
        except Exception as exc:  # noqa: BLE001 - the spec looks at what each task got
            got[(run, prompt_id)] = exc

    threads = [threading.Thread(target=one, args=ask) for ask in asks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return got


def test_tasks_starting_together_share_round_trips_and_each_gets_its_own_prompt(fleet_client, client):
    # Given 40 queued prompts
    prompts = [f"p{n}" for n in range(40)]
    _queued(client, "r", *prompts)
    fleet_client.ping()
    SENT.clear()

    # When 40 tasks take them in at once
    got = _ask_at_once(fleet_client, [("r", pid) for pid in prompts])

    # Then each got its own prompt's ids, its delivery noted, once
    for pid in prompts:
        intake = got[("r", pid)]
        assert (intake.ids, intake.held_by, intake.noted) == (pack_ids([int(pid[1:]), 7]), [], True)
        assert deliveries.holders(client, "r", pid) == ["w1"]
    # in fewer round trips than intakes
    assert SENT["evalsha"] < 40 and SENT["evalsha"] >= 1, SENT


def test_a_lone_intake_is_the_one_script_call_it_always_was(fleet_client, client):
    # Given a process that took a prompt in before (its one INFO: whether the primary has replicas)
    _queued(client, "r", "p0", "p1")
    for_client(fleet_client).take(fleet_client, "r", "p0", "w1", 5)
    SENT.clear()
    # When a task alone takes the next in
    intake = for_client(fleet_client).take(fleet_client, "r", "p1", "w1", 5)
    # Then that is one EVALSHA and nothing else
    assert intake.noted and dict(SENT) == {"evalsha": 1}


def test_a_script_error_is_its_own_tasks_and_not_its_batchs(fleet_client, client):
    # Given prompts of a run, and a run whose ids key Redis holds as another type (a damaged key)
    _queued(client, "good", *(f"p{n}" for n in range(8)))
    client.set(Ledger(client, "bad").keys.token_ids, "not a hash")

    # When tasks of both take their prompts in at once
    got = _ask_at_once(fleet_client, [("good", f"p{n}") for n in range(8)] + [("bad", "p99")])

    # Then the damaged run's task gets its script's error, and every other its intake
    assert isinstance(got[("bad", "p99")], redis.ResponseError)
    assert all(got[("good", f"p{n}")].noted for n in range(8))


def test_each_client_has_its_own_batcher():
    first, second = redis.Redis(), redis.Redis()
    assert for_client(first) is for_client(first) and for_client(first) is not for_client(second)
