"""The bench's processes: one Redis, fresh stand-ins and workers per measurement.

Every figure is taken against real processes started with the project's own
helpers (`producer.local`), so what is measured is what a user runs. One
Redis serves the whole bench and is flushed between measurements; the bench
sets `REDIS_URL` in its own environment, which the settings read and the
workers it starts inherit. Stand-ins are restarted for every
measurement so that their `/standin/stats` window belongs to it alone.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx
import redis

from producer.local import Process, free_port, spawn, start_redis, start_standin, start_worker, wait_for

from .procs import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Standin:
    process: Process
    url: str

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/standin/stats", timeout=30).json()


class Lab:
    """Owns the work folder and every process the bench starts."""

    def __init__(self, root: Path):
        self.root = root
        self.logs = root / "logs"
        self.stack = ExitStack()
        self.redis_process: Process | None = None
        self.redis_url = ""
        self.client: redis.Redis | None = None

    def __enter__(self) -> "Lab":
        self.root.mkdir(parents=True, exist_ok=True)
        self.redis_process, self.redis_url = start_redis(self.logs, data_dir=self.root / "redis")
        self.stack.callback(self.redis_process.stop)
        # Read by the settings built in this process, and inherited by the workers it starts.
        os.environ["REDIS_URL"] = self.redis_url
        os.environ.setdefault("PYTHONPATH", str(ROOT))
        self.client = redis.Redis.from_url(self.redis_url)
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    @property
    def redis_pid(self) -> int:
        assert self.redis_process is not None
        return self.redis_process.popen.pid

    def flush(self) -> None:
        """An empty Redis: no queue, no ledger, no run spec left from a previous part."""
        self.client.flushall()

    def output_dir(self, part: str) -> Path:
        path = self.root / "shards" / part
        path.mkdir(parents=True, exist_ok=True)
        return path

    def standins(self, count: int, options: list[str]) -> list[Standin]:
        """Start `count` fresh stand-ins; stop them with `stop`."""
        started = []
        try:
            for _ in range(count):
                process, url = start_standin(self.logs, None, "--log-level", "warning", *options)
                started.append(Standin(process, url))
        except BaseException:
            self.stop([s.process for s in started])
            raise
        return started

    def gateway(self, urls: list[str]) -> Standin:
        """SGLang's gateway (its stand-in, `sglang_standin.gateway`) in front of `urls`, ready."""
        port = free_port()
        process = spawn(f"gateway-{port}", [sys.executable, "-m", "sglang_standin.gateway", "--port", str(port),
                                            "--worker-urls", *urls], self.logs)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: httpx.get(f"{url}/readiness", timeout=5).status_code == 200, 60, "gateway", process)
        except BaseException:
            process.stop(timeout=30)
            raise
        return Standin(process, url)

    def worker(self, name: str, env: dict[str, str]) -> Process:
        """A real `celery -A workers worker` bound by `env` (SGLANG_URLS, OUTPUT_DIR, ...)."""
        base = {"REDIS_URL": self.redis_url, "PYTHONPATH": str(ROOT)}
        return start_worker(self.logs, name, {**base, **env})

    @staticmethod
    def stop(processes: list[Process]) -> None:
        for process in processes:
            process.stop(timeout=30)

    def run_states(self, run: str) -> dict[str, int]:
        """Prompts of a run by ledger state, as the ledger's transitions count them (O(1))."""
        from contract.ledger.ledger import Ledger

        return Ledger(self.client, run).tally().by_state()

    def wait_finished(self, run: str, total: int, timeout: float, watch: list[Process],
                      on_poll: Callable[[], None] | None = None, interval: float = 0.25) -> dict[str, int]:
        """Until every one of `total` prompts is done or dead; raises with logs otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.run_states(run)
            if on_poll:
                on_poll()
            if states and states.get("queued", 0) == 0 and sum(states.values()) >= total:
                return states
            dead = [p for p in watch if not p.alive()]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0].name} exited" if dead else f"timeout after {timeout:.0f}s"
                logs = "\n".join(f"--- {p.name}\n{p.tail(30)}" for p in watch)
                raise RuntimeError(f"run {run} not finished ({why}); states {states}\n{logs}")
            time.sleep(interval)


class CpuTrace:
    """CPU seconds of some processes sampled over time, to charge a time window.

    A worker spends seconds of CPU importing Celery and transformers before
    its first task; sampling during the run lets a figure count only the
    window that matters (interpolated between samples).
    """

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.samples: list[tuple[float, dict[str, float]]] = []

    def sample(self) -> None:
        now = time.time()
        values = {}
        for name, pid in self.pids.items():
            try:
                values[name] = cpu_seconds(pid)
            except OSError:
                continue
        self.samples.append((now, values))

    def at(self, name: str, when: float) -> float:
        points = [(t, v[name]) for t, v in self.samples if name in v]
        if not points:
            return 0.0
        if when <= points[0][0]:
            return points[0][1]
        for (t0, v0), (t1, v1) in zip(points, points[1:]):
            if t0 <= when <= t1:
                return v0 + (v1 - v0) * (when - t0) / max(t1 - t0, 1e-9)
        return points[-1][1]

    def window(self, name: str, start: float, end: float) -> float:
        return self.at(name, end) - self.at(name, start)

    def total(self, name: str) -> float:
        points = [v[name] for _, v in self.samples if name in v]
        return points[-1] if points else 0.0


def newest_shard_mtime(folder: Path) -> float | None:
    """When the last sample became durable: the newest shard file (not `.tmp-*`)."""
    times = [p.stat().st_mtime for p in folder.iterdir()
             if p.is_file() and not p.name.startswith(".")] if folder.exists() else []
    return max(times) if times else None


def shard_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))
