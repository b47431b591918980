"""The real server's context limits, as the worker meets them: a prompt the server would refuse is a
`prompt_too_long` dead letter before it is sent, and a budget that does not fit is cut to what does."""
from __future__ import annotations

import pytest

from conftest import render, write_prompts

pytestmark = pytest.mark.xdist_group("real-sglang")

CONTEXT, MAX_INPUT = 4096, 4090  # what SGLang 0.5.23 reports for the models of tests/real_sglang.py


def _prompt_of(tokenizer, length: int) -> str:
    """A prompt text that the bundled template renders to exactly `length` ids."""
    text = "a" + " a" * (length - 5)
    assert len(render(tokenizer, [{"role": "user", "content": text}])) == length
    return text


def test_prompts_at_the_real_servers_limits(fleet, tmp_path, tokenizer, shared_sglang):
    # Given the real server (context 4,096; longest input 4,090) and a worker bound to it
    server = shared_sglang("random")
    fleet.worker("w1", [server.url])

    # When prompts of 4,000, 4,089 and 4,090 tokens are enqueued with a budget of 64 tokens
    lengths = {"fits": 4000, "largest": MAX_INPUT - 1, "too-long": MAX_INPUT}
    records = [{"id": name, "prompt": _prompt_of(tokenizer, n)} for name, n in lengths.items()]
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--tokenizer", "bundled",
                   "--temperature", "0", "--max-new-tokens", "64", "--thinking", "off", "--disable-rule", "truncated")

    # Then the first is generated with its whole budget, the largest one the server accepts with its
    # budget cut to what fits the context, each the server's own answer to its ids
    assert fleet.wait_finished(timeout=300) == {"done": 2, "dead": 1}
    rows = {row["id"]: row for row in fleet.rows()}
    assert (rows["fits"]["max_new_tokens"], rows["fits"]["output_len"]) == (64, 64)
    assert rows["largest"]["max_new_tokens"] == CONTEXT - (MAX_INPUT - 1) - 2  # what SGLang answers at most
    for row in rows.values():
        own = server.generate(row["input_ids"][:row["prompt_len"]], max_new_tokens=row["max_new_tokens"],
                              temperature=0)
        assert row["input_ids"][row["prompt_len"]:] == own["output_ids"]
    # and the longest is dead-lettered before it is sent, saying which limit of which server it meets
    [letter] = fleet.dead_letters()
    assert (letter["id"], letter["reason"]) == ("too-long", "prompt_too_long")
    assert "4090 prompt tokens reach the longest input allowed, 4090 tokens (max_req_input_len)" in letter["message"]
    assert server.url in letter["message"]
