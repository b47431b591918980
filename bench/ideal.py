"""The ideal direct client: exactly B requests in flight per server, always.

B lanes per server, each an asyncio task that posts `/generate` and, the
moment its answer arrives, posts the next prompt from a shared list. Nothing
else runs in this loop (no broker, no verification, no storage), so this is
the throughput a server can reach with these prompts at this batch size:
the denominator of the saturation ratio.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import httpx


@dataclass
class IdealResult:
    requests: int
    output_tokens: int
    wall_seconds: float
    client_cpu_seconds: float
    errors: int


async def _drive(urls: list[str], prompts: list[tuple[str, list[int]]], per_server: int,
                 sampling: dict) -> tuple[int, int, int]:
    todo = deque(prompts)
    done = tokens = errors = 0
    lanes = per_server * len(urls)
    limits = httpx.Limits(max_connections=lanes + 8, max_keepalive_connections=lanes + 8)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(3600.0, connect=10.0)) as client:
        async def lane(url: str) -> None:
            nonlocal done, tokens, errors
            while todo:
                rid, ids = todo.popleft()
                body = {"input_ids": ids, "sampling_params": sampling, "rid": rid, "stream": False}
                response = await client.post(f"{url}/generate", json=body)
                if response.status_code != 200:
                    errors += 1
                    continue
                tokens += len(response.json()["output_ids"])
                done += 1

        await asyncio.gather(*(lane(url) for url in urls for _ in range(per_server)))
    return done, tokens, errors


def run_ideal(urls: list[str], prompts: list[tuple[str, list[int]]], per_server: int,
              sampling: dict) -> IdealResult:
    """Send every prompt with `per_server` requests in flight on each server."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    done, tokens, errors = asyncio.run(_drive(urls, prompts, per_server, sampling))
    return IdealResult(done, tokens, time.monotonic() - wall0, time.process_time() - cpu0, errors)
