"""Leases on one clock: workers whose clocks are ten minutes apart never run a prompt twice nor lose one.

kombu scores each delivery with the time it was fetched and restores those
scored older than the lease. Read on each worker's own clock, a worker ten
minutes ahead would restore the fresh deliveries of one ten minutes behind
(generating them again), and a dead worker's deliveries scored ten minutes
ahead would look fresh for twenty. The fleet reads every such time on Redis's
clock.

The workers' wall clocks are skewed from outside, by a `sitecustomize` module
put first on their PYTHONPATH that shifts `time.time` and `time.time_ns`
(what Python code, kombu's and Celery's included, reads), as NTP trouble
would; the monotonic clock is left alone. libfaketime (`faketime` 0.9.10,
Debian bookworm) was the first choice, but under it every `time.sleep` of
Python 3.11 fails with EINVAL (its `clock_nanosleep` with an absolute
deadline), which kills a worker for reasons no real skew has.
"""
from __future__ import annotations

import re
import signal
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import httpx
import redis

from contract.keys import RunKeys

from conftest import varied_prompts, wait_until, write_prompts

LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}
ROOT = Path(__file__).resolve().parents[2]
SHIM = """import os, time
_skew = float(os.environ["TEST_CLOCK_SKEW_SECONDS"])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _skew
time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
"""


def _skewed(shim: Path, seconds: int) -> dict[str, str]:
    """A worker's environment whose wall clock runs `seconds` off."""
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM)
    return {"PYTHONPATH": f"{shim}:{ROOT}", "TEST_CLOCK_SKEW_SECONDS": str(seconds), **LEASE}


def _generations(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]


def _consumers(client: redis.Redis) -> int:
    return sum(1 for c in client.client_list() if c.get("cmd") == "brpop")


def _clock_offset(log: Path) -> float:
    """How far the clock of a worker's last log line runs from this one (its lines are stamped
    by `logging` from `time.time`, which the shim shifts)."""
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+", log.read_text(errors="replace"), re.M)
    return datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S").timestamp() - time.time()


def test_workers_ten_minutes_apart_never_run_a_prompt_twice_nor_lose_one(fleet, tmp_path):
    # Given a worker whose clock is ten minutes ahead and one ten minutes behind, with leases of
    # 8 s, and 24 generations of 15 s each (far longer than a lease) shared between them
    _, url = fleet.standin("--fault-slow", "1", "--slow-seconds", "15")
    ahead = fleet.worker("ahead", [url], **_skewed(tmp_path / "shim", 600))
    behind = fleet.worker("behind", [url], **_skewed(tmp_path / "shim", -600))
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: _consumers(client) >= 2, 90, "both workers consuming", fleet)
    assert abs(_clock_offset(ahead.log) - 600) < 60 and abs(_clock_offset(behind.log) + 600) < 60
    ids = {f"p-{i:04d}" for i in range(24)}
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(24))))

    # When both generate for several leases, each sweeping the other's deliveries every second
    wait_until(lambda: len(_generations(url)) == 24, 90, "every prompt generating", fleet)
    first_round = _generations(url)
    wait_until(lambda: fleet.states().get("done", 0) >= 1, 120, "the first samples stored", fleet)

    # Then none was started twice, and every one is stored once
    assert fleet.wait_finished(timeout=240) == {"done": 24}
    assert first_round == {pid: 1 for pid in ids}
    assert _generations(url) == {pid: 1 for pid in ids}
    assert Counter(r["id"] for r in fleet.rows()) == {pid: 1 for pid in ids}

    # And when the worker ahead dies holding prompts, the one behind gets them within a few leases
    fleet.producer("enqueue", str(write_prompts(tmp_path / "q.jsonl", varied_prompts(8, prefix="q"))))
    notes = RunKeys("default").deliveries
    wait_until(lambda: any(b"ahead@" in (client.hget(notes, f"q-{i:04d}") or b"") for i in range(8)), 90,
               "the worker ahead generating some of the second batch", fleet)
    ahead.signal(signal.SIGKILL)
    ahead.popen.wait(10)
    assert fleet.wait_finished(timeout=120) == {"done": 32}
    assert Counter(r["id"] for r in fleet.rows() if r["id"].startswith("q-")) == {
        f"q-{i:04d}": 1 for i in range(8)}
