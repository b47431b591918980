"""A stand-in for SGLang's model gateway (sgl-model-gateway, formerly sgl-router) in front of N servers.

The tests run the real gateway (sglang-router from the package index, tests/real_gateway.py);
this stand-in is kept for the benchmarks' `gw:` topologies (bench/lab.py), whose figures were
measured with its least-in-flight routing, and it follows a newer gateway than sglang-router
0.3.2 (which answers `/get_server_info` itself and has no `/v1/loads`).

`python -m sglang_standin.gateway --worker-urls URL [URL ...] --port P`

What it reproduces, after the gateway's `server.rs` and `core/worker_manager.rs`
(sgl-project/sglang, 2026 main), is what a client of the gateway sees:
- `GET /health` and `/liveness`: 200 `OK` whatever its workers do (liveness);
  `GET /readiness`: 200 `{"status": "ready", "healthy_workers", "total_workers"}`
  while a worker is healthy, else 503 `{"status": "not ready", "reason": ...}`.
- `GET /workers`: `{"workers": [{"id", "url", "model_id", "priority", "cost",
  "worker_type", "is_healthy", "load", "connection_mode"}], "total", "stats"}`,
  `load` being the requests the gateway has in flight on that worker.
- `GET /server_info`, `/get_server_info`, `/model_info`, `/get_model_info`,
  `/v1/models`, `/health_generate`: forwarded to the first healthy worker.
- `GET /v1/loads` and `/get_loads`: `{"loads": [{"worker", "worker_type", "load"}],
  "total_workers", "successful", "failed"}`, `load` the sum of `num_tokens` of
  the worker's `/get_load` (-1 when it does not answer): tokens, not requests.
- `POST /generate`: to the healthy worker with the fewest requests in flight
  through the gateway (its `power_of_two` policy, without the sampling), body
  and status passed through; 503 when no worker is healthy.
Workers are probed with `GET /health` every `--health-interval` seconds (a
worker is healthy after one 200 and unhealthy after one failure). Imports
nothing of the fleet.

`/generate` is forwarded over a last-in-first-out stack of one-connection
clients per worker (`Lanes`), not one shared `httpx.AsyncClient`: httpcore's
shared pool scans every connection for each request, so with a few hundred
requests in flight the stand-in spent its core there and let only a few dozen
reach its workers (four fleet workers, 576 requests held, 22 running on two
batch-64 servers). The real gateway (Rust) has no such cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

log = logging.getLogger("sglang_standin.gateway")
FORWARDED = ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models",
             "/health_generate")


@dataclass
class Worker:
    url: str
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    healthy: bool = False
    in_flight: int = 0

    def card(self) -> dict:
        return {"id": self.id, "url": self.url, "model_id": "unknown", "priority": 50, "cost": 1.0,
                "worker_type": "regular", "is_healthy": self.healthy, "load": self.in_flight,
                "connection_mode": "Http"}


class Lanes:
    """Idle one-connection clients to the workers, newest first: taking and giving back one is O(1)."""

    def __init__(self):
        self.idle: list[httpx.AsyncClient] = []
        self.every: list[httpx.AsyncClient] = []

    def take(self) -> httpx.AsyncClient:
        if self.idle:
            return self.idle.pop()
        client = httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=10.0), verify=False,
                                   limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        self.every.append(client)
        return client

    def give_back(self, client: httpx.AsyncClient) -> None:
        self.idle.append(client)

    async def close(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.every), return_exceptions=True)


class Gateway:
    def __init__(self, urls: Sequence[str], health_interval: float):
        self.workers = [Worker(u.rstrip("/")) for u in urls]
        self.health_interval = health_interval
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=10.0))  # probes and forwarded GETs
        self.lanes = {w.url: Lanes() for w in self.workers}  # per worker: a lane's connection stays on it
        self._task: asyncio.Task | None = None

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers if w.healthy]

    async def start(self) -> None:
        await self.check_all()
        self._task = asyncio.get_running_loop().create_task(self._health_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.client.aclose()
        await asyncio.gather(*(lanes.close() for lanes in self.lanes.values()))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(w) for w in self.workers))

    async def _check(self, worker: Worker) -> None:
        try:
            ok = (await self.client.get(f"{worker.url}/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok != worker.healthy:
            log.warning("worker %s is %s", worker.url, "healthy" if ok else "unhealthy")
        worker.healthy = ok


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def liveness(request: Request) -> Response:
    return PlainTextResponse("OK")


async def readiness(request: Request) -> Response:
    gw = _gateway(request)
    healthy = gw.healthy()
    if healthy:
        return JSONResponse({"status": "ready", "healthy_workers": len(healthy), "total_workers": len(gw.workers)})
    return JSONResponse({"status": "not ready", "reason": "insufficient healthy workers"}, status_code=503)


async def list_workers(request: Request) -> Response:
    gw = _gateway(request)
    return JSONResponse({"workers": [w.card() for w in gw.workers], "total": len(gw.workers),
                         "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(gw.workers)}})


async def forward_get(request: Request) -> Response:
    gw = _gateway(request)
    healthy = gw.healthy()
    if not healthy:
        return PlainTextResponse("No workers are available", status_code=503)
    upstream = await gw.client.get(f"{healthy[0].url}{request.url.path}", headers=_auth(request))
    return Response(upstream.content, status_code=upstream.status_code,
                    media_type=upstream.headers.get("content-type"))


async def loads(request: Request) -> Response:
    gw = _gateway(request)

    async def one(worker: Worker) -> dict:
        try:
            body = (await gw.client.get(f"{worker.url}/get_load", headers=_auth(request), timeout=5.0)).json()
            load = sum(int(entry.get("num_tokens", 0)) for entry in body)
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            load = -1
        return {"worker": worker.url, "worker_type": None, "load": load}

    found = await asyncio.gather(*(one(w) for w in gw.workers))
    return JSONResponse({"loads": found, "total_workers": len(found),
                         "successful": sum(1 for x in found if x["load"] >= 0),
                         "failed": sum(1 for x in found if x["load"] < 0)})


async def generate(request: Request) -> Response:
    gw = _gateway(request)
    healthy = gw.healthy()
    if not healthy:
        return JSONResponse({"error": {"message": "No available workers"}}, status_code=503)
    worker = min(healthy, key=lambda w: w.in_flight)
    worker.in_flight += 1
    lane = gw.lanes[worker.url].take()
    try:
        upstream = await lane.post(f"{worker.url}/generate", content=await request.body(),
                                   headers={"content-type": "application/json", **_auth(request)})
    except httpx.HTTPError as exc:
        return JSONResponse({"error": {"message": f"call_upstream_request_failed: {exc}"}}, status_code=500)
    finally:
        worker.in_flight -= 1
        gw.lanes[worker.url].give_back(lane)
    return Response(upstream.content, status_code=upstream.status_code,
                    media_type=upstream.headers.get("content-type"))


def _auth(request: Request) -> dict[str, str]:
    value = request.headers.get("authorization")
    return {"authorization": value} if value else {}


def build_app(gateway: Gateway) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        yield
        await gateway.stop()

    routes = [Route("/health", liveness), Route("/liveness", liveness), Route("/readiness", readiness),
              Route("/workers", list_workers), Route("/v1/loads", loads), Route("/get_loads", loads),
              Route("/generate", generate, methods=["POST"]),
              *(Route(path, forward_get) for path in FORWARDED)]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_standin.gateway", description=__doc__.splitlines()[0])
    p.add_argument("--worker-urls", nargs="+", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--health-interval", type=float, default=1.0)
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    app = build_app(Gateway(args.worker_urls, args.health_interval))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, backlog=4096)


if __name__ == "__main__":
    main()
