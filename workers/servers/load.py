"""What a server says about its capacity and its load, over HTTP; and what SGLang's gateway adds.

A plain SGLang server reports its capacity in `/server_info` (read by the
preflight) and its load in `/v1/loads` (2026 builds) or `/get_load` (older,
deprecated later). SGLang's model gateway (sgl-model-gateway, formerly
sgl-router) routes `/generate` over many workers; what it answers itself is
no help here: sglang-router 0.3.2 answers `/get_server_info` with its own
`{"router_manager": true}`, has no `/server_info`, `/model_info` or
`/v1/loads` (404), a `/v1/models` without `max_model_len`, a `/get_loads` of
tokens per worker, and a `/health` that answers 200 with no worker at all. So a
binding is recognised as a gateway by its worker listing (`GET /workers`,
`{"workers": [{"url", "is_healthy", ...}]}`; older routers `GET /list_workers`,
`{"urls": [...]}`), its health is `GET /readiness` (200 while at least one
worker is healthy; `/health` where a router has no `/readiness`), and its
capacity and load are the sums over its healthy workers, each read from the
worker itself (the preflight's part: `workers/servers/gateway_preflight.py`), and a
load that cannot be read in full is not reported (the tuner then keeps its
target). Reads only; every
failure is None, never an exception out of here.
"""
from __future__ import annotations

import logging

import httpx

from .capacity import Load, capacity_from_loads, load_from_loads

log = logging.getLogger(__name__)

LISTINGS = ("/workers", "/list_workers")
LOAD_ROUTES = ("/v1/loads", "/get_load")


def listed_workers(body) -> list[str] | None:
    """The healthy workers of a gateway's listing (new or old shape); None if it is not one."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("workers"), list):
        return [str(w["url"]).rstrip("/") for w in body["workers"]
                if isinstance(w, dict) and w.get("url") and w.get("is_healthy", True) is not False]
    if isinstance(body.get("urls"), list):
        return [str(u).rstrip("/") for u in body["urls"] if u]
    return None


def gateway_workers(client: httpx.Client, url: str) -> list[str] | None:
    """A gateway's healthy workers, or None when `url` is no gateway (or will not list them)."""
    for route in LISTINGS:
        body = _get_json(client, f"{url}{route}")
        found = listed_workers(body)
        if found is not None:
            return found
    return None


def loads_capacity(client: httpx.Client, url: str) -> int | None:
    """The capacity `/v1/loads` reports (each entry's max_running_requests), where it does."""
    return capacity_from_loads(_get_json(client, f"{url}/v1/loads"))


def server_load(client: httpx.Client, url: str) -> Load | None:
    """Running and waiting requests, summed over the server's DP ranks."""
    for route in LOAD_ROUTES:
        load = load_from_loads(_get_json(client, f"{url}{route}"))
        if load is not None:
            return load
    return None


def gateway_load(client: httpx.Client, workers: list[str]) -> Load | None:
    """The sum over the gateway's workers, or None unless every one of them answered."""
    loads = [server_load(client, worker) for worker in workers]
    if not loads or any(load is None for load in loads):
        return None
    return Load(sum(x.running for x in loads), sum(x.waiting for x in loads))  # type: ignore[union-attr]


def _get_json(client: httpx.Client, url: str):
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        log.debug("GET %s failed: %r", url, exc)
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None
