"""A run an older version of the fleet wrote is refused, never read or converted: every
producer command and the worker say so in one message, with what to do, and leave its
keys as they are, while a run of this version goes on beside it.
"""
from __future__ import annotations

import json

import redis

from conftest import varied_prompts, write_prompts
from waiting import wait_until
from contract.broker.config import celery_app
from contract.ledger.codec import pack_ids
from contract.keys import DEFAULT_QUEUE, RUNS
from contract.broker.publish import publish_prompts

REFUSAL = "run 'old' was written by an older version of the fleet"


def _older_run(redis_url: str, spec_of_new: bytes) -> None:
    """Run "old" as a version before the state buckets kept it: a spec that records no key
    layout, the prompts' states in one hash keyed by id, and a message queued for one of them."""
    client = redis.Redis.from_url(redis_url)
    spec = {k: v for k, v in json.loads(spec_of_new).items() if k != "layout"} | {"name": "old"}
    client.set("fleet:run:old", json.dumps(spec))
    client.sadd(RUNS, "old")
    client.hset("fleet:run:old:state", mapping={"p-0000": "queued", "p-0001": "dead"})
    client.hset("fleet:run:old:ids", "p-0000", pack_ids([1, 2, 3]))
    client.hset("fleet:run:old:counters", mapping={"enqueued": 2, "state:queued": 1, "state:dead": 1})
    publish_prompts(celery_app(redis_url, queue=DEFAULT_QUEUE), "old", DEFAULT_QUEUE, [("p-0000", 3, None)])


def _keys_of_old(client: redis.Redis) -> dict[bytes, bytes]:
    return {key: client.dump(key) for key in sorted(client.scan_iter(match="fleet:run:old*"))}


def test_a_run_an_older_version_wrote_is_refused_by_every_command_and_by_the_worker(fleet, tmp_path):
    # Given a run of this version ("new", 3 prompts queued) and one an older version wrote ("old")
    _, url = fleet.standin()
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(3))
    fleet.producer("enqueue", str(prompts), "--run", "new")
    client = redis.Redis.from_url(fleet.redis_url)
    _older_run(fleet.redis_url, client.get("fleet:run:new"))
    before = _keys_of_old(client)

    # When every producer command names the old run
    commands = [["enqueue", str(prompts)], ["status"], ["status", "--json"], ["dead", "list", "--json"],
                ["dead", "show", "p-0001"], ["dead", "stats"], ["dead", "requeue", "--yes"],
                ["dead", "purge", "--yes"], ["export", str(tmp_path / "export")]]
    results = [fleet.producer(*command, "--run", "old", check=False) for command in commands]

    # Then each exits 2 with the one message: which run, why, and to start a new run name
    for result in results:
        assert result.returncode == 2, (result.args, result.stdout, result.stderr)
        assert REFUSAL in result.stderr and "--run NEW_NAME" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr

    # When a worker drains the queue, which holds the old run's message among the new run's
    worker = fleet.worker("w1", [url])
    assert fleet.wait_finished("new") == {"done": 3}
    wait_until(lambda: client.llen(DEFAULT_QUEUE) == 0 and client.hlen("unacked") == 0, 60,
               "the old run's message taken", fleet)

    # Then it refused the old run's prompt, saying so once, and wrote none of its keys
    assert worker.log.read_text().count(REFUSAL) == 1, worker.tail()
    assert _keys_of_old(client) == before
    assert not (fleet.output_dir / "old").exists()
