"""Affinity against real processes: a conversation stays on its server, a loaded server loses its prompts.

Real stand-ins (with their prefix caches), real workers and the real producer:
the `server` column of every stored row says where each turn or prompt was
generated, which is what a user checks.
"""
from __future__ import annotations

import signal
import threading
from collections import defaultdict

import httpx
import redis

from contract.keys import RunKeys
from sglang_standin.config import StandinConfig
from sglang_standin.outputs import generate_output

from conftest import write_prompts
from waiting import health_rounds, wait_until

SLOW = ("--step-base", "0.02", "--output-len-median", "30", "--output-len-max", "120", "--enable-metrics")
SYSTEM = " ".join(f"Rule {i}: answer in plain words, cite the step you use, and check the result." for i in range(12))


def conversation_records(n: int, turns: int) -> list[dict]:
    records = []
    for i in range(n):
        messages = []
        for t in range(turns):
            messages += [{"role": "user", "content": f"Conversation {i}, question {t}: what is {i} * {t + 3}?"},
                         {"role": "assistant", "content": "original"}]
        records.append({"id": f"c-{i:03d}", "messages": messages})
    return records


def test_a_conversations_turns_stay_on_one_server_across_a_worker_restart(fleet, tmp_path):
    # Given two stand-ins, a worker bound to both, and conversations of four turns
    _, a = fleet.standin(*SLOW)
    _, b = fleet.standin(*SLOW)
    first = fleet.worker("first", [a, b], FLEET_SHUTDOWN_GRACE="20")
    fleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", conversation_records(8, 4))),
                   "--turns", "all", "--max-new-tokens", "256")
    # When the worker is stopped with the conversations part done, and another one takes over,
    # bound to the same servers listed the other way round (so load alone would place turns anew)
    wait_until(lambda: fleet.counters().get("state:done", 0) >= 8, 120, "a quarter of the turns", fleet)
    first.signal(signal.SIGTERM)
    first.popen.wait(60)
    fleet.worker("second", [b, a])
    wait_until(lambda: fleet.counters().get("conversations_complete", 0) == 8, 240, "every conversation", fleet)

    # Then every turn is stored, and every conversation's turns were generated on one server
    assert fleet.states() == {"done": 32} and fleet.dead_letters() == []
    servers, workers = defaultdict(set), defaultdict(set)
    for row in fleet.rows():
        servers[row["conversation"]].add(row["server"])
        workers[row["conversation"]].add(row["worker"].split("@")[0])
    assert all(len(found) == 1 for found in servers.values()), dict(servers)
    # (conversations on both servers, and some whose turns both workers generated: the restart
    # fell inside them)
    assert set().union(*servers.values()) == {a, b}
    assert any(found == {"first", "second"} for found in workers.values()), dict(workers)
    # and the later turns found their history in the server's prefix cache
    assert sum(_cached_tokens(url) for url in (a, b)) > 0
    # and the record of each conversation's server went with the conversation
    assert not redis.Redis.from_url(fleet.redis_url).exists(RunKeys("default").conversation_server)


def test_a_server_loaded_beyond_the_margin_loses_its_affinity_to_the_least_loaded(fleet, tmp_path):
    # Given two stand-ins of batch 16 (margin: 2 requests) and a worker bound to both
    _, a = fleet.standin(*BATCH_16)
    _, b = fleet.standin(*BATCH_16)
    fleet.worker("w", [a, b])
    # and a prompt under a long system prompt, generated on one of them
    _enqueue_under_system(fleet, tmp_path, "before-0")
    sticky = _servers(fleet)["before-0"]
    other = b if sticky == a else a
    # When another client keeps one long request there (within the margin), and the worker read it
    with Flood(sticky, clients=1, prompt=_long_prompt()):
        wait_until(lambda: _load(sticky)[0] >= 1, 60, "the other client's request running", fleet)
        health_rounds(fleet.redis_url, 2, fleet=fleet)
        # Then the next prompt under that system prompt still goes there (load alone: to the idle one)
        _enqueue_under_system(fleet, tmp_path, "before-1")
    assert _servers(fleet)["before-1"] == sticky

    # When other clients keep that server far beyond its batch, and the worker has read its load
    with Flood(sticky, clients=96):
        wait_until(lambda: _load(sticky)[1] >= 48, 60, "a queue on the sticky server", fleet)
        health_rounds(fleet.redis_url, 2, fleet=fleet)
        # and more prompts under the same system prompt arrive
        _enqueue_under_system(fleet, tmp_path, *(f"after-{i}" for i in range(3)))

    # Then load wins: they were generated on the other server
    after = {pid: server for pid, server in _servers(fleet).items() if pid.startswith("after-")}
    assert after == {f"after-{i}": other for i in range(3)}


BATCH_16 = ("--max-running-requests", "16", "--step-base", "0.05", "--output-len-median", "30",
            "--output-len-sigma", "1.0", "--output-len-max", "400")


def _long_prompt() -> list[int]:
    """A prompt the stand-in answers with 400 tokens (20 s at these steps), found by its own rule."""
    cfg = StandinConfig(output_len_median=30, output_len_sigma=1.0, output_len_max=400)
    return next(ids for i in range(10_000) if len(generate_output(ids := [100 + i, 200, 300], 1000, cfg)[0]) == 400)


def _enqueue_under_system(fleet, tmp_path, *prompt_ids: str) -> None:
    records = [_under_system(pid) for pid in prompt_ids]
    fleet.producer("enqueue", str(write_prompts(tmp_path / f"{prompt_ids[0]}.jsonl", records)),
                   "--max-new-tokens", "1024")
    fleet.wait_finished()


def _servers(fleet) -> dict[str, str]:
    return {row["id"]: row["server"] for row in fleet.rows()}


def _under_system(prompt_id: str) -> dict:
    return {"id": prompt_id, "messages": [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": f"{prompt_id}: what is 6 * 7?"}]}


class Flood:
    """Other clients, each sending request after request straight to the server while in the block."""

    def __init__(self, url: str, clients: int, prompt: list[int] | None = None):
        self.url, self.prompt, self.stop = url, prompt, threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> "Flood":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()  # each client stops after its request in flight

    def _client(self, i: int) -> None:
        body = {"input_ids": self.prompt or [100 + i, 200, 300, 400], "sampling_params": {"max_new_tokens": 400}}
        while not self.stop.is_set():
            try:
                httpx.post(f"{self.url}/generate", json=body, timeout=300)
            except httpx.HTTPError:  # the test is over and its stand-in stopped
                return


def _load(url: str) -> tuple[int, int]:
    """(running, waiting) as the server reports them."""
    loads = httpx.get(f"{url}/v1/loads", timeout=10).json()["loads"]
    return sum(e["num_running_reqs"] for e in loads), sum(e["num_waiting_reqs"] for e in loads)


def _cached_tokens(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("sglang:cached_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{url}/metrics has no sglang:cached_tokens_total")
