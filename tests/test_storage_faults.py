"""Storage faults and double deliveries: every prompt still ends in exactly one place.

Real redis-server, stand-ins and `celery -A workers worker` processes. The
output storage is broken the way root cannot `chmod` away: the run's folder
under OUTPUT_DIR is moved aside and a plain file takes its place, so every
write below it fails (FileExistsError, NotADirectoryError), then the folder
is put back.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import httpx
import redis

from contract.broker import celery_app
from contract.ledger import Ledger
from contract.publish import publish_prompts
from producer.local import free_port

from conftest import render, messages_of, varied_prompts, write_prompts
from waiting import health_rounds, wait_until

QUEUE = "fleet.generate"
SLOW = ("--step-base", "0.02", "--output-len-max", "100")  # about two seconds a generation
FEW_AT_A_TIME = {"FLEET_CONCURRENCY": "4", "FLEET_MAX_INFLIGHT_PER_SERVER": "4", "FLEET_SHARD_MAX_WAIT": "0.2"}


def break_storage(folder: Path) -> Path:
    aside = folder.with_name(folder.name + "-aside")
    folder.rename(aside)
    folder.write_text("storage outage: a file where the run's folder was")
    return aside


def repair_storage(folder: Path, aside: Path) -> None:
    folder.unlink()
    aside.rename(folder)


def publish_again(fleet, prompt_ids: list[str]) -> None:
    """The same prompts' messages once more, as a broker redelivery or a second enqueue would."""
    app = celery_app(fleet.redis_url, queue=QUEUE)
    publish_prompts(app, "default", QUEUE, [(pid, 1, None) for pid in prompt_ids])


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def queue_drained(fleet) -> bool:
    client = redis.Redis.from_url(fleet.redis_url)
    return client.llen(QUEUE) == 0 and client.hlen("unacked") == 0


def storage_failures(fleet) -> int:
    """Failed writes in a row, as the worker's status shows them."""
    (worker,) = json.loads(fleet.producer("status", "--json").stdout)["workers"]
    return worker["storage"]["failures"]


def generations(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/standin/stats").json()["generations"]


def assert_one_place(fleet, prompts: int) -> None:
    """Counts kept by the transitions equal a full count; no id both stored and dead."""
    states, counters = fleet.states(), fleet.counters()
    report = json.loads(fleet.producer("status", "--json").stdout)
    assert (report["done"], report["dead"], report["pending"]) == \
        (states.get("done", 0), states.get("dead", 0), states.get("queued", 0))
    assert report["done"] + report["dead"] + report["pending"] == counters["enqueued"] == prompts
    letters = fleet.dead_letters()
    assert json.loads(fleet.producer("dead", "stats", "--json").stdout) == Counter(d["reason"] for d in letters)
    stored = {row["id"] for row in fleet.rows()}
    ledger = Ledger(redis.Redis.from_url(fleet.redis_url), "default")
    done = {pid for pid, state in zip(sorted(stored), ledger.states(sorted(stored))) if state == "done"}
    dead = {d["id"] for d in letters}
    assert len(dead) == states.get("dead", 0)
    assert not dead & done and not dead & stored
    assert stored == done and len(done) == states.get("done", 0)


def test_every_prompt_ends_in_exactly_one_place_when_prompts_are_delivered_twice(fleet, tmp_path):
    # Given a worker bound to a server whose every answer fails the think check, and one bound
    # to a server whose answers never do, each taking up to 30 prompts at once; servers not up yet
    bad, good = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    failing = fleet.worker("w1", [bad], FLEET_CONCURRENCY="30")
    fleet.worker("w2", [good], FLEET_CONCURRENCY="30")
    records = varied_prompts(30)
    ids = [r["id"] for r in records]

    # When every prompt is published twice, then both servers come up, so that both workers
    # hold the same prompts at the same time
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    publish_again(fleet, ids)
    five_seconds = ("--step-base", "0.05", "--output-len-max", "100")
    fleet.standin("--fault-missing-think-end", "1", *five_seconds, port=port_of(bad), wait_healthy=False)
    fleet.standin(*five_seconds, port=port_of(good), wait_healthy=False)
    fleet.wait_finished()
    wait_until(lambda: queue_drained(fleet), 120, "every delivery handled", fleet)

    # Then the race happened (some prompts were generated on both servers), and still each
    # prompt is stored or dead, never both, and the counts add up
    assert set(generations(bad)) & set(generations(good))
    assert_one_place(fleet, 30)

    # When the failing worker is gone, the dead letters are requeued and published once more,
    # and the stored prompts are published again too
    failing.stop()
    dead = [d["id"] for d in fleet.dead_letters()]
    fleet.producer("dead", "requeue", "--yes")
    publish_again(fleet, ids)

    # Then every prompt ends stored, once in the ledger's counts, and no letter is left
    assert fleet.wait_finished() == {"done": 30}
    wait_until(lambda: queue_drained(fleet), 120, "every delivery handled", fleet)
    assert_one_place(fleet, 30)
    assert fleet.dead_letters() == [] and fleet.counters()["state:done"] == 30
    assert set(dead) <= {row["id"] for row in fleet.rows()}


def test_a_storage_outage_dead_letters_nothing_and_the_run_goes_on_by_itself(fleet, tmp_path):
    # Given a slow server, and a worker taking four prompts at a time, with metrics
    _, url = fleet.standin(*SLOW)
    port = free_port()
    worker = fleet.worker("w1", [url], FLEET_METRICS_PORT=str(port), **FEW_AT_A_TIME)
    records = varied_prompts(30)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records[:10])))
    wait_until(lambda: fleet.states().get("done", 0) >= 6, 120, "first samples", fleet)

    # When the run's folder stops taking writes, with 20 prompts of the run still to generate
    # (enqueued after the break, so that a busy machine cannot finish the run before it)
    folder = fleet.output_dir / "default"
    aside = break_storage(folder)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "q.jsonl", records[10:])))
    wait_until(lambda: "consuming from nothing: storage failing" in worker.log.read_text(), 120,
               "the worker to stop taking prompts", fleet)
    waiting = redis.Redis.from_url(fleet.redis_url).llen(QUEUE)

    # Then the worker takes no prompt, dead-letters none, and says so in status and metrics
    wait_until(lambda: json.loads(fleet.producer("status", "--json").stdout)["workers"][0]["storage"]
               .get("up") is False, 30, "status to show the outage", fleet)
    assert "failing since" in fleet.producer("status").stdout
    assert "fleet_storage_up 0.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    # (and it had its chances to: two more writes were tried and failed, over more rounds of its checks)
    failures = storage_failures(fleet)
    wait_until(lambda: storage_failures(fleet) >= failures + 2, 60, "two more failed writes", fleet)
    health_rounds(fleet.redis_url, 3, fleet=fleet)
    assert redis.Redis.from_url(fleet.redis_url).llen(QUEUE) == waiting
    assert fleet.dead_letters() == []

    # When the folder is back, the worker goes on by itself: every prompt stored, none dead,
    # each generated once
    repair_storage(folder, aside)
    assert fleet.wait_finished(timeout=180) == {"done": 30}
    assert fleet.dead_letters() == []
    assert sorted(row["id"] for row in fleet.rows()) == sorted(r["id"] for r in records)
    assert len(generations(url)) == 30 and set(generations(url).values()) == {1}
    log = worker.log.read_text()
    assert log.count("storage failing:") == 1 and log.count("storage back after") == 1
    assert "fleet_storage_up 1.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text


def test_one_bad_row_fails_only_its_own_prompt(fleet, tokenizer, tmp_path):
    # Given a server that answers a third of the prompts with an output id no shard can hold
    # (beyond int32, negative, a float, null, a string, a boolean), and a worker grouping many
    # samples per shard
    kinds = "huge_id,negative,float,null,string,bool"
    _, url = fleet.standin("--fault-bad-output", "0.33", "--bad-output-kinds", kinds)
    fleet.worker("w1", [url], FLEET_SHARD_MAX_WAIT="1")
    records = varied_prompts(40)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    fleet.wait_finished()

    # Then each hit prompt is dead-lettered on its own, and every other prompt is stored
    stats = httpx.get(f"{url}/standin/stats").json()
    hit = set(stats.get("bad_outputs") or {})
    dead = {d["id"]: d for d in fleet.dead_letters()}
    rows = {row["id"]: row for row in fleet.rows()}
    assert hit and set(dead) == hit and not hit & set(rows)
    assert all(d["reason"] == "bad_output" for d in dead.values()), dead
    for record in records:
        if record["id"] not in hit:
            assert rows[record["id"]]["input_ids"][:rows[record["id"]]["prompt_len"]] == \
                render(tokenizer, messages_of(record))


def test_a_sample_waiting_past_its_commit_deadline_gives_its_prompt_back(fleet, tmp_path):
    # Given a worker whose samples wait at most two seconds for their shard
    _, url = fleet.standin(*SLOW)
    worker = fleet.worker("w1", [url], FLEET_SHARD_COMMIT_TIMEOUT="2", **FEW_AT_A_TIME)
    records = varied_prompts(16)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records[:8])))
    wait_until(lambda: fleet.states().get("done", 0) >= 4, 120, "first samples", fleet)

    # When storage fails for longer than that, with 8 prompts of the run still to generate
    # (enqueued after the break, so that a busy machine cannot finish the run before it)
    folder = fleet.output_dir / "default"
    aside = break_storage(folder)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "q.jsonl", records[8:])))
    wait_until(lambda: "prompt given back" in worker.log.read_text(), 60, "a prompt given back", fleet)
    # (and none is dead-lettered while two more writes are tried and fail)
    failures = storage_failures(fleet)
    wait_until(lambda: storage_failures(fleet) >= failures + 2, 60, "two more failed writes", fleet)
    assert fleet.dead_letters() == []
    repair_storage(folder, aside)

    # Then the prompts given back were generated again and stored once; none is dead
    assert fleet.wait_finished(timeout=180) == {"done": 16}
    assert fleet.dead_letters() == []
    given_back = set(re.findall(r"prompt (\S+): no shard took its sample", worker.log.read_text()))
    counts = generations(url)
    assert given_back and all(counts[pid] == 2 for pid in given_back)
    assert all(n == 1 for pid, n in counts.items() if pid not in given_back)
    assert Counter(row["id"] for row in fleet.rows()) == Counter(r["id"] for r in records)
