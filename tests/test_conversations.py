"""Whole conversations regenerated turn by turn, through a worker's death and a Redis restart.

The stand-in answers each prompt deterministically from its ids, so `replay`
computes, for every turn of every conversation, exactly what must be stored:
the template's rendering (transformers' own `apply_chat_template`) of the
system message, the user turns so far and the model's own earlier answers,
followed by the stand-in's output for exactly those ids.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter

import httpx
import pyarrow.parquet as pq
import redis

from contract.keys import RunKeys
from producer.local import start_redis
from sglang_standin.config import StandinConfig
from sglang_standin.outputs import generate_output

from conftest import render, wait_until, write_prompts

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


def replay(tokenizer, record: dict, cfg: StandinConfig = StandinConfig()) -> list[list[int]]:
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
        output, finish = generate_output(prompt, MAX_NEW_TOKENS, cfg)
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
    port = int(fleet.redis_url.rsplit(":", 1)[1].split("/")[0])
    victim = fleet.worker("victim", [url], **LEASE)
    fleet.worker("survivor", [url], **LEASE)
    records = conversations(COUNT)
    cfg = StandinConfig(output_len_median=60)
    expected = {f"{r['id']}#{t}": ids for r in records for t, ids in enumerate(replay(tokenizer, r, cfg))}
    fleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", records)), "--turns", "all",
                   "--max-new-tokens", str(MAX_NEW_TOKENS))
    client = redis.Redis.from_url(fleet.redis_url)

    # When a worker is SIGKILLed mid-run with turns in hand
    wait_until(lambda: _counters(client).get("state:done", 0) >= len(expected) // 5, 120, "first turns", fleet)
    held = {pid.decode() for pid, holders in client.hgetall(RunKeys("default").deliveries).items()
            if b"victim" in holders}
    victim.signal(signal.SIGKILL)
    # (an export of complete conversations meanwhile holds whole conversations only)
    assert _exported_turns(fleet, tmp_path / "partial") <= set(expected)
    # and Redis restarts on the same port and data later
    wait_until(lambda: _counters(client).get("state:done", 0) >= len(expected) // 2, 180, "half the turns", fleet)
    broker.stop()
    time.sleep(1)
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
