"""The ideal direct client: exactly B requests in flight per server, always.

B lanes per server, each an asyncio task that posts `/generate` and, the
moment its answer arrives, posts the next prompt from a shared list. Nothing
else runs in this loop (no broker, no verification, no storage), so this is
the throughput a server can reach with these prompts at this batch size:
the denominator of the saturation ratio.

Each lane has its own `httpx.AsyncClient` with one keep-alive connection.
One client shared by 256 lanes spends most of its CPU in httpcore's pool
(`_assign_requests_to_connections` scans every connection for every queued
request): about 30 s of CPU for 600 requests here, enough to starve the
stand-in on two cores and make the "ideal" side the slow one.
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
    retried: int = 0  # requests whose connection failed (a burst of 2,048 connects can overflow
                      # the server's accept backlog): sent again, as any client would


async def _drive(urls: list[str], prompts: list[tuple[str, list[int]]], per_server: int,
                 sampling: dict) -> tuple[int, int, int, int]:
    todo = deque(prompts)
    done = tokens = errors = retried = 0
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    timeout = httpx.Timeout(3600.0, connect=10.0)
    # Plain HTTP to local servers: verify=False spares loading the CA bundle per client.
    lanes = [(url, httpx.AsyncClient(limits=limits, timeout=timeout, verify=False))
             for url in urls for _ in range(per_server)]

    async def lane(url: str, client: httpx.AsyncClient) -> None:
        nonlocal done, tokens, errors, retried
        while todo:
            rid, ids = todo.popleft()
            body = {"input_ids": ids, "sampling_params": sampling, "rid": rid, "stream": False}
            try:
                response = await client.post(f"{url}/generate", json=body)
            except httpx.TransportError:
                retried += 1
                if retried > len(prompts):
                    raise
                todo.appendleft((f"{rid}-again{retried}", ids))
                continue
            if response.status_code != 200:
                errors += 1
                continue
            tokens += len(response.json()["output_ids"])
            done += 1

    try:
        await asyncio.gather(*(lane(url, client) for url, client in lanes))
    finally:
        await asyncio.gather(*(client.aclose() for _, client in lanes))
    return done, tokens, errors, retried


def run_ideal(urls: list[str], prompts: list[tuple[str, list[int]]], per_server: int,
              sampling: dict) -> IdealResult:
    """Send every prompt with `per_server` requests in flight on each server."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    done, tokens, errors, retried = asyncio.run(_drive(urls, prompts, per_server, sampling))
    return IdealResult(done, tokens, time.monotonic() - wall0, time.process_time() - cpu0, errors, retried)
