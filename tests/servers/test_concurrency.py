"""Many requests in flight from one worker: every prompt still ends stored once, token-exact.

The worker's task threads share one HTTP client (`workers/servers/sglang_client.py`:
a urllib3 pool per server); with hundreds of threads posting and reading at
once, no answer may reach the wrong prompt, be cut, or be stored twice.
"""
from __future__ import annotations

import threading
from collections import Counter

import httpx

from sglang_standin.cli import parse_config
from sglang_standin.outputs import generate_output

from conftest import messages_of, render, varied_prompts, write_prompts

MAX_NEW_TOKENS = 256
# ~40-token answers at 200 ms a step: each request stays in flight about eight seconds, longer than
# the worker takes to start 512 of them
SLOW = ("--max-running-requests", "256", "--step-base", "0.2", "--step-per-request", "0",
        "--prefill-per-token", "0", "--output-len-median", "40", "--output-len-max", "60")


def test_a_worker_with_512_threads_stores_every_prompt_once_with_its_exact_tokens(fleet, tokenizer, tmp_path):
    # Given two stand-ins of batch 256 and one worker keeping up to 256 requests in flight on each
    _, url_a = fleet.standin(*SLOW)
    _, url_b = fleet.standin(*SLOW)
    fleet.worker("w1", [url_a, url_b], FLEET_MAX_INFLIGHT_PER_SERVER="256", FLEET_CONCURRENCY="512")
    records = varied_prompts(1500)
    prompts = write_prompts(tmp_path / "prompts.jsonl", records)

    # When 1,500 prompts are enqueued and drained, the servers' running counts sampled meanwhile
    peak, done = [0], threading.Event()

    def sample() -> None:
        with httpx.Client(timeout=10) as client:
            while not done.wait(0.2):
                try:
                    running = sum(client.get(f"{u}/standin/stats").json()["running"] for u in (url_a, url_b))
                except httpx.HTTPError:
                    continue
                peak[0] = max(peak[0], running)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fleet.producer("enqueue", str(prompts), "--max-new-tokens", str(MAX_NEW_TOKENS))
        states = fleet.wait_finished(timeout=600)
    finally:
        done.set()
        sampler.join()

    # Then the worker had more requests in flight than one server's batch holds...
    assert peak[0] > 256
    # ...and every prompt is stored exactly once, nothing dead-lettered...
    assert states == {"done": 1500}
    rows = fleet.rows()
    assert Counter(row["id"] for row in rows) == Counter({r["id"]: 1 for r in records})
    assert fleet.dead_letters() == []
    # ...each sample being its own prompt followed by exactly the server's output for it
    standin = parse_config(["--port", "1", *SLOW])
    by_id = {row["id"]: row for row in rows}
    for record in records:
        prompt_ids = render(tokenizer, messages_of(record))
        output_ids, _ = generate_output(prompt_ids, MAX_NEW_TOKENS, standin)
        assert by_id[record["id"]]["input_ids"] == prompt_ids + output_ids, record["id"]
