"""The ideal direct client: exactly B requests in flight on a server of batch B, always.

B lanes per server (its own batch size, so servers of different sizes each
get their fill), each an asyncio task that posts `/generate` and, the
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
    dropped_connections: int = 0  # sent again on a new connection


async def _drive(servers: list[tuple[str, int]], prompts: list[tuple[str, list[int]]],
                 sampling: dict) -> tuple[int, int, int, int]:
    todo = deque(prompts)
    done = tokens = errors = 0
    dropped = [0]
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    timeout = httpx.Timeout(3600.0, connect=10.0)
    # Plain HTTP to local servers: verify=False spares loading the CA bundle per client.
    lanes = [(url, httpx.AsyncClient(limits=limits, timeout=timeout, verify=False))
             for url, lanes in servers for _ in range(lanes)]

    async def lane(url: str, client: httpx.AsyncClient) -> None:
        nonlocal done, tokens, errors
        while todo:
            rid, ids = todo.popleft()
            body = {"input_ids": ids, "sampling_params": sampling, "rid": rid, "stream": False}
            try:
                response = await client.post(f"{url}/generate", json=body)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
                # A connection the server (or an overloaded machine) dropped: the client opens
                # another and sends the prompt again, as any real client would; counted, not fatal.
                todo.appendleft((rid, ids))
                dropped[0] += 1
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
    return done, tokens, errors, dropped[0]


def run_ideal(servers: list[tuple[str, int]], prompts: list[tuple[str, list[int]]],
              sampling: dict) -> IdealResult:
    """Send every prompt with (url, B): B requests in flight on each server."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    done, tokens, errors, dropped = asyncio.run(_drive(servers, prompts, sampling))
    return IdealResult(done, tokens, time.monotonic() - wall0, time.process_time() - cpu0, errors, dropped)
