"""The whole path: a prompt file becomes token-exact Parquet shards, through Redis and Celery."""
from __future__ import annotations

from collections import Counter

import redis

from sglang_standin.cli import parse_config
from sglang_standin.outputs import generate_output

from conftest import messages_of, render, varied_prompts, write_prompts

MAX_NEW_TOKENS = 4096


def test_every_prompt_is_stored_once_with_its_exact_tokens(fleet, tokenizer, tmp_path):
    # Given two SGLang stand-ins, two real workers bound to both, and 300 prompts in three forms
    _, url_a = fleet.standin("--max-running-requests", "32")
    _, url_b = fleet.standin("--max-running-requests", "32")
    fleet.worker("w1", [url_a, url_b])
    fleet.worker("w2", [url_a, url_b])
    records = varied_prompts(300)
    prompts = write_prompts(tmp_path / "prompts.jsonl", records)

    # When the producer enqueues them and the fleet drains the queue
    fleet.producer("enqueue", str(prompts), "--max-new-tokens", str(MAX_NEW_TOKENS))
    assert fleet.counters()["enqueued"] == 300
    states = fleet.wait_finished()

    # Then every prompt is stored exactly once, nothing is dead-lettered...
    assert states == {"done": 300}
    rows = fleet.rows()
    counts = Counter(row["id"] for row in rows)
    assert set(counts) == {r["id"] for r in records}
    assert max(counts.values()) == 1
    assert fleet.dead_letters() == []

    # ...and each sample is the tokenizer's own rendering followed by exactly the server's output
    standin = parse_config(["--port", "1"])
    for record in records:
        row = next(r for r in rows if r["id"] == record["id"])
        prompt_ids = render(tokenizer, messages_of(record))
        output_ids, finish = generate_output(prompt_ids, MAX_NEW_TOKENS, standin)
        assert row["input_ids"] == prompt_ids + output_ids
        assert row["prompt_len"] == len(prompt_ids)
        assert row["output_len"] == len(output_ids)
        assert row["finish_reason"] == "stop" and output_ids[-1] == 1  # EOS kept
        assert row["input_ids"][row["think_end_index"]] == 128822
    # and both servers did the work
    assert {r["server"] for r in rows} == {url_a, url_b}


def test_a_line_without_id_gets_a_stable_id(fleet, tmp_path):
    # Given a file whose lines have no ids
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    prompts = write_prompts(tmp_path / "p.jsonl", [{"prompt": "Why is the sky blue?"},
                                                    {"messages": [{"role": "user", "content": "2+2?"}]}])

    # When it is enqueued twice
    fleet.producer("enqueue", str(prompts))
    fleet.wait_finished()
    fleet.producer("enqueue", str(prompts))

    # Then the second enqueue recognises both prompts as done and publishes nothing
    assert fleet.counters()["enqueued"] == 2
    assert redis.Redis.from_url(fleet.redis_url).llen("fleet.generate") == 0
    assert fleet.wait_finished() == {"done": 2}
    ids = sorted(r["id"] for r in fleet.rows())
    assert len(ids) == 2 and all(i.startswith("p-") for i in ids)
