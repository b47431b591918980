"""Think-structure verification, retries and the dead-letter queue, against every fault."""
from __future__ import annotations

import json
from collections import Counter

import httpx
import pyarrow.parquet as pq
import pytest
import redis

from sglang_standin.cli import parse_config
from sglang_standin.outputs import fault_for, generate_output
from contract.keys import DEFAULT_QUEUE, RunKeys
from contract.broker.config import celery_app
from contract.broker.publish import publish_prompts
from contract.run.spec import run_queues

from conftest import messages_of, render, varied_prompts, write_prompts

FAULTS = ["missing-think-end", "double-think-end", "echo-prompt", "empty-reasoning", "empty-answer",
          "truncate", "abort", "count-mismatch", "http500-first", "queue-full-first"]
EXPECTED_REASON = {
    "missing_think_end": "missing_think_end",
    "double_think_end": "multiple_think_end",
    "echo_prompt": "think_start_in_output",
    "empty_reasoning": "empty_reasoning",
    "empty_answer": "empty_answer",
    "truncate": "truncated",
    "abort": "aborted",
    "count_mismatch": "token_count_mismatch",
}
STANDIN = ["--output-len-max", "256", "--max-running-requests", "64"] + \
    [arg for name in FAULTS for arg in (f"--fault-{name}", "0.07")]


def _expected(records, tokenizer, cfg):
    """What the test itself expects for each prompt, from the stand-in's deterministic faults."""
    plan = {}
    for record in records:
        ids = render(tokenizer, messages_of(record))
        fault = fault_for(ids, cfg)
        plan[record["id"]] = (ids, fault, EXPECTED_REASON.get(fault))
    return plan


def _faulty_run(fleet, tokenizer, tmp_path) -> tuple[str, object, dict]:
    """Given a stand-in injecting every fault into a share of 200 prompts, and a worker bound to it,
    when the prompts are enqueued with a budget the truncation fault exceeds and the run finishes:
    the server's URL, its config and the test's own plan of what each prompt must become."""
    _, url = fleet.standin(*STANDIN)
    fleet.worker("w1", [url], FLEET_RETRY_BACKOFF="0.05")
    records = varied_prompts(200)
    cfg = parse_config(["--port", "1", *STANDIN])
    plan = _expected(records, tokenizer, cfg)
    assert {fault for _, fault, _ in plan.values()} >= {f.replace("-", "_") for f in FAULTS}
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--max-new-tokens", "300")
    fleet.wait_finished()
    return url, cfg, plan


def test_each_fault_is_dead_lettered_with_its_reason_and_transient_ones_are_stored(fleet, tokenizer, tmp_path):
    # Given / When: a run of 200 prompts against every fault
    url, cfg, plan = _faulty_run(fleet, tokenizer, tmp_path)

    # Then each faulty prompt is dead-lettered with the right code, and not in the shards
    dead = {d["id"]: d for d in fleet.dead_letters()}
    rows = {r["id"]: r for r in fleet.rows()}
    for pid, (ids, fault, reason) in plan.items():
        if reason:
            assert dead[pid]["reason"] == reason, (pid, fault, dead.get(pid))
            assert dead[pid]["message"]
            assert pid not in rows
        else:  # no fault, or only a transient 500/503: stored with its exact tokens
            assert pid not in dead, (pid, fault, dead[pid])
            output, _ = generate_output(ids, 300, cfg)
            assert rows[pid]["input_ids"] == ids + output
    assert len(dead) + len(rows) == len(plan)

    # and the worker logs each dead letter once, as one line that names it and where to look,
    # never as a task that raised something unexpected
    log = next(p for p in fleet.processes if p.name == "w1").log.read_text()
    for pid, letter in dead.items():
        (line,) = [line for line in log.splitlines() if f"prompt {pid} of run default dead-lettered" in line]
        assert f"{letter['reason']}: " in line and f"python -m producer dead show {pid} --run default" in line
    assert "raised unexpected" not in log and "UnpickleableExceptionWrapper" not in log

    # and a prompt is generated once unless a retry was needed (500/503 answers are not generations)
    stats = httpx.get(f"{url}/standin/stats").json()
    assert set(stats["generations"].values()) == {1}
    retried = [pid for pid, (_, fault, _) in plan.items() if fault in ("http500_first", "queue_full_first")]
    assert retried and all(stats["attempts"][pid] == 2 for pid in retried)
    assert all(rows[pid]["attempts"] == 2 for pid in retried)

    # and the dead letter explains itself: payload to replay, excerpt with the think positions
    letter = json.loads(fleet.producer("dead", "show", "--json", next(p for p, d in dead.items()
                                                             if d["reason"] == "multiple_think_end")).stdout)
    assert len(letter["excerpt"]["think_end"]) == 2 and letter["prompt_ids"] == plan[letter["id"]][0]
    assert letter["sampling"]["max_new_tokens"] == 300 and letter["servers"] == [url]


def test_truncated_prompts_requeued_with_a_larger_budget_are_stored_whole(fleet, tokenizer, tmp_path):
    # Given a finished run whose truncated prompts are dead letters
    _, cfg, plan = _faulty_run(fleet, tokenizer, tmp_path)
    stats_before = json.loads(fleet.producer("dead", "stats", "--json").stdout)
    truncated = [d["id"] for d in fleet.dead_letters() if d["reason"] == "truncated"]
    assert truncated

    # When they are requeued with a larger budget
    fleet.producer("dead", "requeue", "--reason", "truncated", "--max-new-tokens", "1024", "--yes")
    fleet.wait_finished()

    # Then they are stored with their full output and leave the dead-letter queue
    rows = {r["id"]: r for r in fleet.rows()}
    again = {d["id"]: d for d in fleet.dead_letters() if d["id"] in truncated}
    log = next(p for p in fleet.processes if p.name == "w1").log.read_text().splitlines()
    assert not again, {pid: (d["reason"], d["message"], d.get("sampling"),
                             [line for line in log if pid in line]) for pid, d in again.items()}
    for pid in truncated:
        ids = plan[pid][0]
        output, finish = generate_output(ids, 1024, cfg)
        assert finish["type"] == "stop" and rows[pid]["input_ids"] == ids + output
    stats_after = json.loads(fleet.producer("dead", "stats", "--json").stdout)
    assert "truncated" not in stats_after
    assert sum(stats_after.values()) == sum(stats_before.values()) - len(truncated)


def test_requeued_prompts_are_generated_at_their_larger_budget_whatever_message_brings_them(
        fleet, tokenizer, tmp_path):
    # Given a finished run whose truncated prompts are dead letters, and its worker stopped
    url, cfg, plan = _faulty_run(fleet, tokenizer, tmp_path)
    truncated = sorted(d["id"] for d in fleet.dead_letters() if d["reason"] == "truncated")
    assert len(truncated) >= 2
    next(p for p in fleet.processes if p.name == "w1").stop()

    # When they are requeued with a larger budget, the broker then loses their messages, and an older
    # message of the first one, at the run's budget, is still queued (a duplicate from before)
    fleet.producer("dead", "requeue", "--reason", "truncated", "--max-new-tokens", "1024", "--yes")
    client = redis.Redis.from_url(fleet.redis_url)
    (queue,) = run_queues(client, DEFAULT_QUEUE).values()
    assert client.llen(queue) == len(truncated)
    client.delete(queue)
    older = truncated[0]
    publish_prompts(celery_app(fleet.redis_url, queue=queue), "default", queue, [(older, len(plan[older][0]), 300)])
    # and a worker starts
    fleet.worker("w2", [url])

    # Then each is generated at the budget it was requeued with: the older message's prompt at once, the
    # others once the audit has published their lost messages again; all stored whole, none dead again
    fleet.wait_finished()
    rows = {r["id"]: r for r in fleet.rows()}
    for pid in truncated:
        output, finish = generate_output(plan[pid][0], 1024, cfg)
        assert finish["type"] == "stop" and rows[pid]["input_ids"] == plan[pid][0] + output, fleet.dead_letters()
        assert rows[pid]["max_new_tokens"] == 1024
    assert "audit: republished" in next(p for p in fleet.processes if p.name == "w2").log.read_text()


def test_export_holds_each_stored_id_once_with_a_manifest(fleet, tokenizer, tmp_path):
    # Given a finished run with stored samples and dead letters
    _faulty_run(fleet, tokenizer, tmp_path)
    rows = {r["id"]: r for r in fleet.rows()}
    stats = json.loads(fleet.producer("dead", "stats", "--json").stdout)

    # When the dataset is exported
    fleet.producer("export", str(tmp_path / "export"))

    # Then each stored id is there once, and the manifest says what it holds
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    exported = [i for f in manifest["files"]
                for i in pq.read_table(tmp_path / "export" / f["name"]).column("id").to_pylist()]
    assert Counter(exported).most_common(1)[0][1] == 1
    assert set(exported) == set(rows) and manifest["rows"] == len(rows)
    assert manifest["dead_letters"] == stats


def test_a_prompt_longer_than_the_context_is_dead_lettered_before_sending(fleet, tmp_path):
    # Given a server with a small context
    _, url = fleet.standin("--context-length", "64")
    fleet.worker("w1", [url])
    records = [{"id": "short", "prompt": "Hi"}, {"id": "long", "prompt": "word " * 200}]

    # When both are enqueued
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--max-new-tokens", "16")
    fleet.wait_finished()

    # Then the long one is a prompt_too_long dead letter and never reached the server
    dead = {d["id"]: d for d in fleet.dead_letters()}
    assert dead["long"]["reason"] == "prompt_too_long"
    stats = httpx.get(f"{url}/standin/stats").json()
    assert "long" not in stats["attempts"]


@pytest.mark.parametrize("damage, why", [
    ("corrupt", "2 crashes; last: ValueError"),
    ("delete", "queued, but the ledger holds no token ids"),
])
def test_a_prompt_whose_ledger_entry_is_damaged_ends_as_a_worker_error(fleet, tmp_path, damage, why):
    # Given two queued prompts, the token ids of one of them corrupted or gone from the ledger
    _, url = fleet.standin()
    records = varied_prompts(2)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    client = redis.Redis.from_url(fleet.redis_url)
    if damage == "corrupt":
        client.hset(RunKeys("default").token_ids, records[0]["id"], b"\x07not token ids")
    else:
        client.hdel(RunKeys("default").token_ids, records[0]["id"])

    # When a worker that gives a prompt two tries takes them
    fleet.worker("w1", [url], FLEET_MAX_CRASHES="2")

    # Then the damaged one is a worker_error dead letter that says why (neither requeued forever
    # nor acknowledged and forgotten), and the other is stored
    assert fleet.wait_finished() == {"done": 1, "dead": 1}
    [letter] = fleet.dead_letters()
    assert letter["id"] == records[0]["id"] and letter["reason"] == "worker_error"
    assert why in letter["message"]
