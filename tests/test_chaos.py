"""Chaos: workers SIGKILLed, a server killed, Redis restarted, mid-run. Every prompt ends in one place."""
from __future__ import annotations

import json
import random
import signal
from collections import defaultdict

import pyarrow.parquet as pq
import redis

from contract.fleet import heartbeats
from producer.local import free_port, start_redis
from sglang_standin.cli import parse_config
from sglang_standin.outputs import fault_for, generate_output

from conftest import messages_of, render, varied_prompts, write_prompts
from waiting import stop_broker, wait_until

N = 1000
BUDGET = 300
STANDIN = ["--output-len-max", "256", "--step-base", "0.005", "--max-running-requests", "64",
           "--fault-missing-think-end", "0.03", "--fault-truncate", "0.03",
           "--fault-http500-first", "0.03", "--fault-queue-full-first", "0.03"]
WORKER = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1", "FLEET_RETRY_BACKOFF": "0.05"}
REASON = {"missing_think_end": "missing_think_end", "truncate": "truncated"}


def server_seen_down(fleet, url: str, names: list[str]) -> bool:
    """Whether each named worker's last heartbeat shows the server at `url` not healthy."""
    records = {r["worker"].split("@")[0]: r for r in heartbeats.read_all(redis.Redis.from_url(fleet.redis_url))}
    return all(name in records and any(s["url"] == url and s["state"] != "healthy" for s in records[name]["servers"])
               for name in names)


def test_every_prompt_ends_in_exactly_one_place_whatever_fails(fleet, tokenizer, tmp_path):
    rng = random.Random(7)
    # Given Redis with append-only persistence, two servers with faults, and two workers
    data, port = tmp_path / "redis-data", free_port()
    broker, fleet.redis_url = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True)
    fleet.processes.append(broker)
    _, url_a = fleet.standin(*STANDIN)
    port_b = free_port()
    server_b, url_b = fleet.standin(*STANDIN, port=port_b)
    workers = [fleet.worker(f"w{i}", [url_a, url_b], **WORKER) for i in (1, 2)]
    records = varied_prompts(N)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)),
                   "--max-new-tokens", str(BUDGET))

    # When, at random moments, workers are SIGKILLed (and replaced), a server is killed and
    # restarted, and Redis restarts
    def at(share: float) -> None:
        """Until `share` of the prompts are finished (a fault strikes then), or fail saying so."""
        finished = lambda: sum(n for state, n in fleet.states().items() if state != "queued")  # noqa: E731
        wait_until(lambda: finished() >= share * N, 300, f"{share:.0%} of the prompts finished", fleet, 0.1)

    at(rng.uniform(0.10, 0.20))
    workers[0].signal(signal.SIGKILL)
    workers.append(fleet.worker("w3", [url_a, url_b], **WORKER))
    at(rng.uniform(0.30, 0.40))
    server_b.signal(signal.SIGKILL)
    wait_until(lambda: server_seen_down(fleet, url_b, ["w2", "w3"]), 60, "the live workers to see a server down", fleet)
    fleet.standin(*STANDIN, port=port_b)
    at(rng.uniform(0.50, 0.60))
    stop_broker(broker, workers[1:], fleet)
    broker, _ = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True)
    fleet.processes.append(broker)
    at(rng.uniform(0.65, 0.80))
    workers[1].signal(signal.SIGKILL)
    workers.append(fleet.worker("w4", [url_a, url_b], **WORKER))

    # Then every prompt is in the dataset or the dead-letter queue, never both, none lost
    states = fleet.wait_finished(timeout=420)
    assert sum(states.values()) == N and set(states) <= {"done", "dead"}
    rows = fleet.rows()
    by_id = defaultdict(list)
    for row in rows:
        by_id[row["id"]].append(row["input_ids"])
    dead = {d["id"]: d for d in fleet.dead_letters()}
    assert set(by_id) | set(dead) == {r["id"] for r in records}
    assert not set(by_id) & set(dead)
    # any duplicate is identical
    assert all(all(copy == copies[0] for copy in copies) for copies in by_id.values())

    # and each prompt is where its fault puts it, with exact tokens
    cfg = parse_config(["--port", "1", *STANDIN])
    for record in records:
        ids = render(tokenizer, messages_of(record))
        reason = REASON.get(fault_for(ids, cfg))
        if reason:
            assert dead[record["id"]]["reason"] == reason
        else:
            output, _ = generate_output(ids, BUDGET, cfg)
            assert by_id[record["id"]][0] == ids + output, record["id"]

    # and export holds each stored id exactly once
    fleet.producer("export", str(tmp_path / "export"))
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    exported = [i for f in manifest["files"]
                for i in pq.read_table(tmp_path / "export" / f["name"], columns=["id"]).column("id").to_pylist()]
    assert sorted(exported) == sorted(by_id)
