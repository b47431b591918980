"""Prefix-cache hits end to end: the server's meta_info.cached_tokens in the shards, on the worker's
/metrics, and in `status`, all agreeing with what the server itself counted."""
from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from producer.local import free_port

from conftest import wait_until, write_prompts

SYSTEM = ("You are a patient mathematics tutor. Explain every step, name the rule you use, check the "
          "result by a second method, and end with the answer on its own line. ") * 12


def series(text: str, name: str) -> dict[tuple, float]:
    """One sample name's values on a /metrics page, by label values."""
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


def test_cached_tokens_reach_the_shards_the_metrics_and_status(fleet, tmp_path):
    # Given a stand-in with a prefix cache and a worker sending it one prompt at a time, so that
    # each prompt after the first finds the shared system prompt cached
    _, url = fleet.standin("--prefix-cache-tokens", "200000", "--enable-metrics")
    port = free_port()
    fleet.worker("w1", [url], FLEET_METRICS_PORT=str(port), FLEET_MAX_INFLIGHT_PER_SERVER="1")
    before = series(httpx.get(f"{url}/metrics", timeout=5).text, "sglang:cached_tokens_total")

    # When four prompts sharing a long system prompt are generated
    prompts = [{"id": f"c-{i}", "messages": [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": f"What is {i} * {i + 7}?"}]}
               for i in range(4)]
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts)))
    assert fleet.wait_finished() == {"done": 4}

    # Then each row keeps the server's figure, and they add up to what the server counted
    rows = fleet.rows()
    cached = [r["cached_tokens"] for r in rows]
    assert all(c is not None and 0 <= c < r["prompt_len"] for c, r in zip(cached, rows))
    after = series(httpx.get(f"{url}/metrics", timeout=5).text, "sglang:cached_tokens_total")
    assert sum(cached) == sum(after.values()) - sum(before.values())
    assert sorted(cached)[1] > len(SYSTEM) // 10  # three prompts found (at least) the system prompt cached
    prompt_tokens = sum(r["prompt_len"] for r in rows)

    # and the worker's /metrics counted the same, under the server's name
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert series(page, "fleet_cached_tokens_total") == {(("server", url),): sum(cached)}
    assert series(page, "fleet_prompt_tokens_total") == {(("server", url),): prompt_tokens}

    # and status shows the server's hit share over the last minutes, once a heartbeat carries it
    share = round(sum(cached) / prompt_tokens, 4)

    def status_share():
        report = json.loads(fleet.producer("status", "--json").stdout)
        return [(s["server"], s["share"]) for s in report["cache_hits"]["servers"]]

    wait_until(lambda: status_share() == [(url, share)], 30, "status showing the hit share", fleet)
    table = fleet.producer("status", COLUMNS="200").stdout
    [line] = [line for line in table.splitlines() if url in line and "%" in line]
    assert f"{100 * share:.1f}%" in line and f"{sum(cached):,}" in line
