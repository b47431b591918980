"""Concurrency that tunes itself, against real processes: stand-ins of different sizes, and a gateway.

A worker with every setting at its default reads each server's capacity from
what it reports and keeps its running batch full with a short queue; bound to
SGLang's gateway (the real sglang-router, tests/real_gateway.py) it treats the
gateway as one server whose capacity is its workers' sum, and its health
follows the gateway's readiness.
"""
from __future__ import annotations

import json
import statistics
import threading

import httpx
import pytest

from conftest import write_prompts
from real_gateway import start_gateway
from waiting import wait_until

# Long enough generations (~1.5 s) that a sample of the servers' queues says something.
SLOW = ("--step-base", "0.01", "--output-len-median", "150", "--output-len-sigma", "0.1", "--output-len-max", "200")


def prompts(n: int) -> list[dict]:
    return [{"id": f"cap-{i:04d}", "prompt": f"Question {i}: what is {i} + {i * 3}?"} for i in range(n)]


class Sampler:
    """Each stand-in's running and waiting counts (its /standin/stats), four times a second."""

    def __init__(self, urls: list[str]):
        self.urls, self.samples = urls, {u: [] for u in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for url in self.urls:
                try:
                    stats = httpx.get(f"{url}/standin/stats", timeout=5).json()
                except httpx.HTTPError:
                    continue
                self.samples[url].append((stats["running"], stats["waiting"]))

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(10)

    def busy(self, url: str) -> list[tuple[int, int]]:
        """The samples taken while the server had work (the warm-up before the first prompt left out)."""
        return [s for s in self.samples[url] if s[0] > 0]


@pytest.mark.xdist_group("measures")  # samples how full the batches run: never beside another measuring test
def test_a_worker_with_defaults_fills_a_batch_8_and_a_batch_32_server_with_a_short_queue(fleet, tmp_path):
    # Given a batch-8 and a batch-32 server behind one worker, every fleet setting at its default
    _, small = fleet.standin("--max-running-requests", "8", *SLOW)
    _, large = fleet.standin("--max-running-requests", "32", *SLOW)
    fleet.worker("w1", [small, large])
    total = 400

    # When a run of many batches' worth of prompts drains through it
    with Sampler([small, large]) as sampler:
        fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts(total))))
        states = fleet.wait_finished(timeout=300)

    # Then every prompt is stored
    assert states == {"done": total}
    assert len({row["id"] for row in fleet.rows()}) == total
    # and, in the middle of the run, each server ran a full batch with only a short queue behind it
    for url, batch, queue in ((small, 8, 2 * 2), (large, 32, 2 * 4)):
        busy = sampler.busy(url)
        middle = busy[len(busy) // 4: 3 * len(busy) // 4]
        assert middle, f"no samples of {url}"
        running = statistics.median(r for r, _ in middle)
        waiting = statistics.median(w for _, w in middle)
        assert running >= batch - 1, f"{url}: median {running} running of {batch} ({middle})"
        assert waiting <= queue, f"{url}: median {waiting} waiting, more than {queue} ({middle})"
    # and the worker shows what it found
    (worker,) = json.loads(fleet.producer("status", "--json").stdout)["workers"]
    found = {s["url"]: (s["capacity"], s["target"]) for s in worker["servers"]}
    assert found[small][0] == 8 and found[large][0] == 32


def test_a_worker_bound_to_a_gateway_treats_it_as_one_server_of_its_workers_capacity(fleet, tmp_path):
    # Given SGLang's gateway (sglang-router, the real one) in front of a batch-8 and a batch-32 server
    backends = [fleet.standin("--max-running-requests", str(n))[1] for n in (8, 32)]
    gateway = start_gateway(fleet.logs, backends)
    fleet.processes.append(gateway.process)
    url = gateway.url

    # When a worker bound to the gateway's URL alone, with defaults, drains a run
    fleet.worker("w1", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts(120))))
    states = fleet.wait_finished(timeout=300)

    # Then every prompt is stored, through the gateway, by both of its workers
    assert states == {"done": 120}
    assert {row["server"] for row in fleet.rows()} == {url}
    assert all(httpx.get(f"{b}/standin/stats", timeout=5).json()["tokens_generated"] > 0 for b in backends)
    # and the worker sees one server whose capacity is the sum of the gateway's workers'
    (worker,) = json.loads(fleet.producer("status", "--json").stdout)["workers"]
    (server,) = worker["servers"]
    assert (server["url"], server["state"], server["capacity"], server["gateway_workers"]) == (url, "healthy", 40, 2)

    # When every server behind the gateway stops (the gateway itself still answers /health)
    for process in fleet.processes[:2]:
        process.stop()

    # Then the worker sees the gateway as not ready (its /readiness answers 503: warming)
    def gateway_state() -> str:
        (w,) = json.loads(fleet.producer("status", "--json").stdout)["workers"]
        return w["servers"][0]["state"]

    wait_until(lambda: gateway_state() == "warming", 60, "the gateway seen as not ready", fleet, poll=1.0)
