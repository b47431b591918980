"""No prompt takes a server down: a worker sends a run's prompts only to servers whose own tokenizer
gives the run's ids (contract/chat/tokenizer_probe.py), against the real SGLang server, which dies whole on
an input id its model lacks."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from conftest import render, write_prompts
from waiting import wait_until

pytestmark = pytest.mark.xdist_group("real-sglang")

ADDED = ["<tool_a>", "<tool_b>", "<tool_c>", "<tool_d>"]


def _six_prompts(uses_added: str) -> list[dict]:
    """Six prompts, the fourth of which uses one of the added tokens."""
    records = [{"id": f"p{i}", "prompt": f"Question {i}: how many apples are in {i + 2} baskets?"} for i in range(6)]
    records[3]["prompt"] = f"Call {uses_added} and report."
    return records


def _status(fleet, run: str) -> dict:
    return json.loads(fleet.producer("status", "--json", "--run", run).stdout)


def test_a_run_tokenized_for_another_model_is_refused_by_the_server_and_never_sent(
        fleet, tmp_path, tokenizer, shared_sglang):
    from real_sglang import tokenizer_with_added_tokens

    # Given the real server of a model with the bundled vocabulary, and a worker bound to it
    server = shared_sglang("random")
    worker = fleet.worker("w1", [server.url])
    # and a tokenizer with four tokens the model lacks (ids beyond its vocabulary)
    extended = tokenizer_with_added_tokens(tokenizer, tmp_path / "extended-tokenizer", ADDED)

    # When a run of six prompts, one of them with an added token, is enqueued with that tokenizer
    prompts = write_prompts(tmp_path / "p.jsonl", _six_prompts(ADDED[1]))
    fleet.producer("enqueue", str(prompts), "--tokenizer", str(extended), "--run", "wrong", "--max-new-tokens", "8")

    # Then the worker names the server, the run and the first id that differs, once
    wait_until(lambda: "REFUSES run wrong" in worker.tail(200), 120, "the worker's refusal", fleet)
    line = next(l for l in worker.tail(200).splitlines() if "REFUSES run wrong" in l)
    assert server.url in line and "<tool_" in line and f"id {len(tokenizer)}" in line
    # and status shows it beside the server
    wait_until(lambda: any("wrong" in (s.get("refused_runs") or {}) for w in _status(fleet, "wrong")["workers"]
                           for s in w["servers"]), 30, "status showing the refusal", fleet)
    # and no prompt went to the server: it stays up, and all six wait in the queue, none dead-lettered
    time.sleep(5)
    assert server.process.alive() and httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert fleet.states("wrong") == {"queued": 6}
    assert fleet.dead_letters("wrong") == []

    # When the same prompts are enqueued under another run with the server's own tokenizer
    fleet.producer("enqueue", str(prompts), "--tokenizer", "bundled", "--run", "right", "--max-new-tokens", "8",
                   "--thinking", "off", "--disable-rule", "truncated")

    # Then the server takes that run: every prompt stored, exactly as the bundled tokenizer renders it
    assert fleet.wait_finished("right", timeout=240) == {"done": 6}
    by_id = {row["id"]: row for row in fleet.rows("right")}
    for record in _six_prompts(ADDED[1]):
        expected = render(tokenizer, [{"role": "user", "content": record["prompt"]}])
        assert by_id[record["id"]]["input_ids"][:by_id[record["id"]]["prompt_len"]] == expected
    assert fleet.states("wrong") == {"queued": 6}
