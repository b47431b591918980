"""Watching a run against the real SGLang server (its CPU engine, tests/real_sglang.py): what an operator
sees in `python -m producer status --json` and in Flower while the run goes, and once it is done.

The stand-in's answers carry what the real server's do not (`num_running_reqs` in meta_info, a
`context_length` in /server_info), so the numbers an operator reads (the server's context length and
capacity, the run's moving counts) are checked here against the real server too.
"""
from __future__ import annotations

import json
import secrets
import time

import httpx
import pytest

from producer.local import wait_for

from conftest import varied_prompts, write_prompts
from real_sglang import CONTEXT
from reporting.test_flower import HOST, start_flower, succeeded, worker_online

pytestmark = pytest.mark.xdist_group("real-sglang")

CAPACITY = 2048  # the real server's effective_max_running_requests_per_dp at --max-total-tokens 16384


def _status(fleet) -> dict:
    return json.loads(fleet.producer("status", "--json").stdout)


def test_status_and_flower_follow_a_run_on_the_real_server_from_start_to_finish(fleet, tmp_path, shared_sglang):
    # Given the real server (random model), a worker bound to it that keeps 2 requests in flight (so that
    # the run takes some seconds), and Flower (basic auth, which its API needs) seeing the worker online
    server = shared_sglang("random")
    fleet.worker("w1", [server.url], FLEET_MAX_INFLIGHT_PER_SERVER="2")
    auth = ("admin", "pw-" + secrets.token_hex(8))
    _, flower = start_flower(fleet, FLOWER_BASIC_AUTH=":".join(auth))
    worker = f"w1@{HOST}"
    wait_for(lambda: worker_online(flower, worker), 60, "flower seeing w1 online")

    # When a run of 20 prompts of 96 new tokens each is enqueued, and status is asked again and again
    # while it goes
    n, budget = 20, 96
    records = varied_prompts(n)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--tokenizer", "bundled",
                   "--temperature", "0", "--max-new-tokens", str(budget), "--thinking", "off",
                   "--disable-rule", "truncated")
    seen: list[dict] = []
    deadline = time.monotonic() + 300
    while not (seen and seen[-1]["finished"]):
        assert time.monotonic() < deadline, f"the run did not finish: {seen[-1] if seen else None}\n{fleet.logs_tail()}"
        seen.append(_status(fleet))

    # Then, while it ran, status showed prompts in flight and the done count moving up, every prompt
    # accounted for at every look
    running = [s for s in seen if not s["finished"]]
    assert all(s["prompts"] == n and s["queued"] + s["in_flight"] + s["done"] + s["dead"] == n for s in seen)
    assert any(s["in_flight"] > 0 and 0 < s["done"] < n for s in running), [(s["in_flight"], s["done"]) for s in seen]
    dones = [s["done"] for s in seen]
    assert dones == sorted(dones) and len({d for d in dones if d < n}) >= 2, dones
    # and the server healthy, with the real server's context length and capacity, as the worker read them
    for look in running:
        (seen_by_worker,) = look["workers"]
        (shown,) = seen_by_worker["servers"]
        assert (shown["url"], shown["state"], shown["max_model_len"], shown["capacity"]) == \
            (server.url, "healthy", CONTEXT, CAPACITY), shown
    # and once it is done, status says finished with every prompt done, none dead
    final = seen[-1]
    assert (final["done"], final["dead"], final["queued"], final["in_flight"]) == (n, 0, 0, 0)
    assert final["dead_by_reason"] == {} and final["output_tokens"] == n * budget
    assert fleet.dead_letters() == []
    assert sorted(row["id"] for row in fleet.rows()) == sorted(r["id"] for r in records)

    # And Flower shows the worker and every prompt's task succeeded on it
    wait_for(lambda: succeeded(flower, worker) == n, 30, f"flower counting {n} succeeded tasks")
    tasks = httpx.get(f"{flower}/api/tasks", auth=auth, timeout=10).json()
    assert set(tasks) == {f"default:{r['id']}" for r in records}
    assert {(task["state"], task["worker"]) for task in tasks.values()} == {("SUCCESS", worker)}
    workers = httpx.get(f"{flower}/api/workers", params={"status": "true"}, auth=auth, timeout=10).json()
    assert workers == {worker: True}
