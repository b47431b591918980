"""Whole conversations regenerated turn by turn, through a worker's death and a Redis restart.

The stand-in answers each prompt deterministically from its ids, so `replay`
computes, for every turn of every conversation, exactly what must be stored:
the template's rendering (transformers' own `apply_chat_template`) of the
system message, the user turns so far and the model's own earlier answers,
followed by the stand-in's output for exactly those ids.
"""
from __future__ import annotations

import json
import os
import signal
from collections import Counter

import httpx
import pyarrow.parquet as pq
import redis

from contract.ledger.codec import unpack_ids
from contract.keys import RunKeys
from contract.ledger.ledger import Ledger
from producer.local import start_redis
from sglang_standin.config import StandinConfig
from sglang_standin.outputs import generate_output

from conftest import render, write_prompts
from waiting import stop_broker, wait_until

LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}
MAX_NEW_TOKENS = 1024
COUNT = int(os.environ.get("FLEET_TEST_CONVERSATIONS", "30"))  # a slow run: a few hundred


def conversations(n: int) -> list[dict]:
    """n conversations of 2 to 4 user turns with their original answers, in the three input forms."""
    records = []
    for i in range(n):
        users = [f"Conversation {i}, question {t}: what is {i} + {t}?" for t in range(2 + i % 3)]
        messages = [{"role": "system", "content": "Answer briefly."}] if i % 2 else []
        for t, text in enumerate(users):
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": f"original {t}"}]
        if i % 3 == 0:
            messages = messages[:-1]  # ends on a user turn: answered too
        if i % 4 == 3:
            names = {"system": "system", "user": "human", "assistant": "gpt"}
            records.append({"id": f"c-{i:04d}", "conversations": [
                {"from": names[m["role"]], "value": m["content"]} for m in messages]})
        else:
            records.append({"id": f"c-{i:04d}", "messages": messages})
    return records


def replay(tokenizer, record: dict, cfg: StandinConfig = StandinConfig(),
           budget=lambda ids: MAX_NEW_TOKENS) -> list[list[int]]:
    """Each turn's expected `input_ids`: the prompt the template renders from the regenerated
    history, then the stand-in's answer to exactly it. The history is built here by hand:
    the system message, the user turns so far, and each earlier turn's answer as a client
    sends it back (content after think-end, reasoning beside it, both stripped)."""
    if "conversations" in record:
        roles = {"system": "system", "human": "user", "gpt": "assistant"}
        messages = [{"role": roles[t["from"]], "content": t["value"]} for t in record["conversations"]]
    else:
        messages = record["messages"]
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    history = [m for m in messages if m["role"] == "system"]
    turns = []
    for user in (m for m in messages if m["role"] == "user"):
        history.append(user)
        prompt = render(tokenizer, history)
        output, finish = generate_output(prompt, budget(prompt), cfg)
        assert finish["type"] == "stop"
        turns.append(prompt + output)
        body = output[:-1]
        end = body.index(think_end)
        history.append({"role": "assistant", "content": tokenizer.decode(body[end + 1:]).strip(),
                        "reasoning_content": tokenizer.decode(body[:end]).strip()})
    return turns


def _counters(client: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(RunKeys("default").counters).items()}


def test_every_turn_is_regenerated_once_from_the_models_own_history_through_a_kill_and_a_redis_restart(
        fleet, tokenizer, tmp_path):
    # Given Redis with persistence, a stand-in, two workers, and conversations of several user turns
    _, url = fleet.standin("--step-base", "0.01", "--output-len-median", "60")
    data = tmp_path / "redis-data"
    broker, fleet.redis_url = start_redis(fleet.logs, port=None, data_dir=data, appendonly=True)
    fleet.processes.append(broker)
    port = int(fleet.redis_url.rsplit(":", 1)[1].split("/")[0])
    victim = fleet.worker("victim", [url], **LEASE)
    survivor = fleet.worker("survivor", [url], **LEASE)
    records = conversations(COUNT)
    cfg = StandinConfig(output_len_median=60)
    expected = {f"{r['id']}#{t}": ids for r in records for t, ids in enumerate(replay(tokenizer, r, cfg))}
    fleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", records)), "--turns", "all",
                   "--max-new-tokens", str(MAX_NEW_TOKENS))
    client = redis.Redis.from_url(fleet.redis_url)

    # When a worker is SIGKILLed mid-run with turns in hand
    wait_until(lambda: _counters(client).get("state:done", 0) >= len(expected) // 5, 120, "first turns", fleet)
    victim.signal(signal.SIGKILL)
    victim.popen.wait(30)
    # (the turns it held: their deliveries stay recorded until another worker finishes them, a lease later)
    held = {pid.decode() for pid, holders in client.hgetall(RunKeys("default").deliveries).items()
            if b"victim" in holders}
    # (an export of complete conversations meanwhile holds whole conversations only)
    assert _exported_turns(fleet, tmp_path / "partial") <= set(expected)
    # and Redis restarts on the same port and data later
    wait_until(lambda: _counters(client).get("state:done", 0) >= len(expected) // 2, 180, "half the turns", fleet)
    stop_broker(broker, [survivor], fleet)
    broker, _ = start_redis(fleet.logs, port=port, data_dir=data, appendonly=True)
    fleet.processes.append(broker)

    # Then every conversation completes, with every turn stored
    wait_until(lambda: _counters(client).get("conversations_complete", 0) == COUNT, 300,
               "every conversation complete", fleet)
    counters = _counters(client)
    assert counters["conversations"] == COUNT and counters["conversation_turns"] == len(expected)
    assert fleet.states() == {"done": len(expected)}
    assert fleet.dead_letters() == []
    # each stored turn is exactly the template's prompt from the regenerated history plus the
    # stand-in's answer to it, with its conversation and turn index
    rows = {}
    for row in fleet.rows():
        assert row["input_ids"] == expected[row["id"]], row["id"]
        assert f"{row['conversation']}#{row['turn']}" == row["id"]
        assert row["prompt_len"] < len(row["input_ids"])
        rows[row["id"]] = row
    assert set(rows) == set(expected)
    # and nothing was generated twice, but a turn the killed worker held when it died
    generations = httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]
    assert set(generations) == set(expected)
    twice = {pid for pid, n in generations.items() if n > 1}
    assert twice <= held and max(generations.values()) <= 2, (twice, held)
    assert Counter(r["id"] for r in fleet.rows()).most_common(1)[0][1] <= 2
    # and an export of complete conversations holds every turn once
    assert _exported_turns(fleet, tmp_path / "export") == set(expected)


def _exported_turns(fleet, dest) -> set[str]:
    """`export --complete-only`: the turn ids exported, checked to be whole conversations, each turn once."""
    fleet.producer("export", str(dest), "--complete-only")
    rows = [r for f in sorted(dest.glob("part-*.parquet"))
            for r in pq.read_table(f, columns=["id", "conversation", "turn"]).to_pylist()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    by_conversation = Counter(r["conversation"] for r in rows)
    for conversation, n in by_conversation.items():
        assert {r["turn"] for r in rows if r["conversation"] == conversation} == set(range(n))
        assert f"{conversation}#{n}" not in ids
    return set(ids)


def test_a_dead_lettered_turn_stops_its_conversation_and_dead_requeue_resumes_it_from_that_turn(
        fleet, tokenizer, tmp_path):
    # Given turns of which a share outgrow the run's budget (truncated), and one worker
    standin = ("--output-len-median", "40", "--fault-truncate", "0.25", "--fault-truncate-tokens", "1500")
    _, url = fleet.standin(*standin)
    fleet.worker("w1", [url])
    records = conversations(12)
    cfg = StandinConfig(output_len_median=40, fault_truncate=0.25, fault_truncate_tokens=1500)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", records)), "--turns", "all",
                   "--max-new-tokens", "1000")
    client = redis.Redis.from_url(fleet.redis_url)
    rounds = 0
    while True:
        # When the run settles: every conversation complete or stopped at a dead turn
        wait_until(lambda: _settled(fleet), 180, "every conversation complete or stopped", fleet, poll=1)
        letters = fleet.dead_letters()
        # Then each stopped conversation's letter names its conversation and turn, and no later turn exists
        for letter in letters:
            conversation, turn = letter["id"].rsplit("#", 1)
            assert letter["reason"] == "truncated"
            assert (letter["excerpt"]["conversation"], letter["excerpt"]["turn"]) == (conversation, int(turn))
            assert Ledger(client, "default").state(f"{conversation}#{int(turn) + 1}") is None
        if not letters:
            break
        assert rounds < 6, letters
        rounds += 1
        # and `dead requeue` with a larger budget resumes each from its dead turn
        fleet.producer("dead", "requeue", "--reason", "truncated", "--max-new-tokens", "4000", "--yes")
    assert rounds >= 1  # the fault share stopped at least one conversation
    assert _counters(client)["conversations_complete"] == 12
    # each stored turn still exactly what the regenerated history gives, each turn generated once, or
    # twice when it was dead-lettered once and replayed
    expected = {f"{r['id']}#{t}": ids for r in records
                for t, ids in enumerate(replay(tokenizer, r, cfg, budget=lambda ids: 4000))}
    assert {r["id"]: r["input_ids"] for r in fleet.rows()} == expected
    generations = httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]
    assert set(generations) == set(expected) and set(generations.values()) <= {1, 2}


def _settled(fleet) -> bool:
    status = json.loads(fleet.producer("status", "--json").stdout)
    talks = status["conversations"]
    return status["finished"] and talks["complete"] + talks["stopped"] == talks["enqueued"]


def test_a_turn_stored_by_a_worker_that_died_before_moving_on_is_moved_on_without_being_generated_again(
        fleet, tokenizer, tmp_path):
    # Given two conversations whose turn 0 a worker stored and marked done, then died before queueing
    # turn 1: one whose message is still held (it will be redelivered), one whose message is gone
    _, url = fleet.standin("--output-len-median", "40")
    records = conversations(2)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", records)), "--turns", "all",
                   "--max-new-tokens", "1000")
    client = redis.Redis.from_url(fleet.redis_url)
    ledger = Ledger(client, "default")
    think_end, eos = tokenizer.convert_tokens_to_ids("</think>"), tokenizer.eos_token_id
    stored = {}
    for record in records:
        first = f"{record['id']}#0"
        prompt = list(unpack_ids(ledger.intake(first)[0]))
        output = tokenizer.encode(" a dead worker's reasoning ", add_special_tokens=False) + [think_end] + \
            tokenizer.encode(f" Answer of {record['id']}. ", add_special_tokens=False) + [eos]
        stored[record["id"]] = (prompt, output)
        shard = _write_row(fleet, first, prompt, output, record["id"])
        ledger.mark_done(first, len(output), shard=shard)
    gone = f"default:{records[1]['id']}#0"
    queue = "fleet.generate"
    for raw in client.lrange(queue, 0, -1):
        if json.loads(raw)["headers"]["id"] == gone:
            client.lrem(queue, 1, raw)

    # When a worker starts
    worker = fleet.worker("w1", [url])

    # Then both conversations complete: the held message's redelivery and the audit move them on,
    # turn 0 is never generated, and turn 1 is rendered from the dead worker's stored answer
    wait_until(lambda: _counters(client).get("conversations_complete", 0) == 2, 120, "both complete", fleet)
    generations = httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]
    assert not any(pid.endswith("#0") for pid in generations) and set(generations.values()) == {1}
    assert f"audit: turn {records[1]['id']}#0 was stored but its conversation had not moved on" in worker.log.read_text()
    cfg = StandinConfig(output_len_median=40)
    for record in records:
        prompt, output = stored[record["id"]]
        history = [m for m in record.get("messages", []) if m["role"] == "system"]
        users = [m for m in record["messages"] if m["role"] == "user"]
        history += [users[0], {"role": "assistant", "content": f"Answer of {record['id']}.",
                               "reasoning_content": "a dead worker's reasoning"}, users[1]]
        expected = render(tokenizer, history)
        row = next(r for r in fleet.rows() if r["id"] == f"{record['id']}#1")
        assert row["input_ids"] == expected + generate_output(expected, 1000, cfg)[0]


def _write_row(fleet, prompt_id: str, prompt: list[int], output: list[int], conversation: str) -> str:
    """A shard holding one stored turn, as a worker writes it."""
    from datetime import datetime, timezone

    from contract.storage.schema import Sample, samples_to_table

    folder = fleet.output_dir / "default"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-dead-worker-{prompt_id.replace('#', '-')}.parquet"
    now = datetime.now(timezone.utc)
    sample = Sample(id=prompt_id, input_ids=prompt + output, prompt_len=len(prompt), output_len=len(output),
                    finish_reason="stop", stop_token=output[-1], think_end_index=None, run="default",
                    server="http://dead", model=None, max_new_tokens=1000, temperature=0.6, top_p=0.95,
                    attempts=1, worker="dead", tokenizer_fingerprint="", template_fingerprint="",
                    e2e_latency=None, started_at=now, finished_at=now, conversation=conversation, turn=0)
    pq.write_table(samples_to_table([sample]), path)
    return str(path)
