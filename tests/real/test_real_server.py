"""A worker bound to the real SGLang server (its CPU engine, tests/real_sglang.py): samples equal to
the server's own answers, token for token, and the think check through the real engine."""
from __future__ import annotations

import pytest

from conftest import render, varied_prompts, write_prompts
from real_sglang import expected_trace

pytestmark = pytest.mark.xdist_group("real-sglang")  # one real server at a time beside the suite


def test_every_sample_is_the_real_servers_own_answer_to_its_ids(fleet, tmp_path, tokenizer, sglang_models):
    # Given the real server with a random model, and a worker bound to it
    server = fleet.sglang(sglang_models["random"])
    fleet.worker("w1", [server.url])

    # When a run of 12 prompts is enqueued at temperature 0 (random weights stop only at the budget)
    n = 12
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--tokenizer", "bundled",
                   "--temperature", "0", "--max-new-tokens", "24", "--thinking", "off",
                   "--disable-rule", "truncated")

    # Then every prompt is stored, and each sample is exactly the prompt's ids then the server's own
    # answer to them, asked again directly
    assert fleet.wait_finished(timeout=300) == {"done": n}
    rows = fleet.rows()
    assert len(rows) == n
    for row in rows:
        prompt = row["input_ids"][:row["prompt_len"]]
        own = server.generate(prompt, max_new_tokens=24, temperature=0)
        assert row["input_ids"][row["prompt_len"]:] == own["output_ids"], row["id"]
        assert row["finish_reason"] == "length" and row["output_len"] == 24


def test_a_reasoning_trace_through_the_real_engine_is_verified_and_stored(fleet, tmp_path, tokenizer,
                                                                          sglang_models):
    # Given the real server with the trace model (it reasons after <think>, then answers and stops)
    server = fleet.sglang(sglang_models["trace"])
    fleet.worker("w1", [server.url])

    # When prompts are enqueued with the bundled reasoning template
    n = 8
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--tokenizer", "bundled",
                   "--max-new-tokens", "64")

    # Then each is stored with its think-end where the trace put it, and nothing is dead-lettered
    assert fleet.wait_finished(timeout=300) == {"done": n}
    trace = expected_trace(tokenizer, thinking=True)
    for row in fleet.rows():
        assert row["input_ids"][row["prompt_len"]:] == trace
        assert row["think_end_index"] == row["prompt_len"] + trace.index(128822)
        assert row["finish_reason"] == "stop"
