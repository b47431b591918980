"""`GET /v1/loads` (and, with `--serve-get-load`, the older `/get_load`): live load, as SGLang reports it.

Why: routers and clients poll these to see how busy a server is before
sending more. `/v1/loads` is SGLang 0.5.23's, measured on the real server:
`{timestamp, version, accelerator, num_accelerators, loads: [...]}`, each
load `{timestamp (a float), dp_rank, num_running_reqs, num_waiting_reqs, ...,
max_total_num_tokens, max_running_requests, token_usage, gen_throughput,
cache_hit_rate, utilization, ...}` and, as `include` asks (all by default),
the `memory`, `disaggregation` and `queues` sections; an unknown section is
a bare 500, as there. `/get_load` is 404 on 0.5.23; older releases served
`[{dp_rank, num_reqs, num_waiting_reqs, num_tokens, num_pending_tokens,
ts_tic}]` with `num_reqs = running + waiting` (`--serve-get-load` for tests
of a client against those).

The stand-in has one DP rank (0). Its "GPU" numbers are modelled:
`max_total_num_tokens` (`--max-total-tokens`, else a context per batch
slot), used tokens are prompt + produced tokens of running requests,
`utilization` is the token usage, `gen_throughput` tokens per busy second,
cache hits 0. `?format=prometheus` answers the numeric fields as Prometheus text.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from sglang_standin import errors
from sglang_standin.routes_info import VERSION
from sglang_standin.state import StandinState

#: GetLoadsReqInput.VALID_SECTIONS.
VALID_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def rank_load(state: StandinState, include: set[str]) -> dict:
    """One `loads` entry (dp rank 0), sections as `include` asks."""
    cfg, engine = state.cfg, state.engine
    used, pending = engine.token_counts()
    capacity = cfg.max_total_num_tokens
    usage = round(used / capacity, 4) if capacity else 0.0
    busy = state.stats.busy_seconds()
    load: dict = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": engine.running_count,
        "num_waiting_reqs": engine.waiting_count,
        "num_waiting_uncached_tokens": pending,
        "num_used_tokens": used,
        "num_total_tokens": used + pending,
        "num_active_tokens": used,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": capacity,
        "max_running_requests": cfg.max_running,
        "token_usage": usage,
        "gen_throughput": round(state.stats.tokens_generated / busy, 2) if busy > 0 else 0.0,
        "cache_hit_rate": 0.0,
        "utilization": usage,
        "total_prefill_uncached_tokens": state.stats.prompt_tokens - state.stats.cached_tokens,
        "total_prefill_busy_us": 0,
        "decode_moments": [0.0] * 6 if state.stats.tokens_generated else None,  # null before a decode
    }
    if include & {"all", "memory"}:
        load["memory"] = {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": capacity}
    if include & {"all", "disagg"}:
        load["disaggregation"] = {
            "mode": "null", "prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}
    if include & {"all", "queues"}:
        load["queues"] = {"waiting": engine.waiting_count, "grammar": 0, "paused": 0, "retracted": 0,
                          "prealloc_ready": 0}
    return load


async def v1_loads(request: Request) -> Response:
    """GET /v1/loads[?dp_rank=N][&include=a,b][&format=json|prometheus]."""
    state: StandinState = request.app.state.standin
    params = request.query_params
    include = {s.strip() for s in params["include"].split(",")} if params.get("include") else {"all"}
    if include - VALID_SECTIONS:  # a ValueError that 0.5.23 does not catch
        return errors.internal_error()
    try:
        dp_rank = None if params.get("dp_rank") is None else int(params["dp_rank"])
    except ValueError:
        return errors.schema_error(f"dp_rank: Input should be a valid integer, got {params['dp_rank']!r}")
    loads = [rank_load(state, include)] if dp_rank in (None, 0) else []
    if params.get("format") == "prometheus":
        return PlainTextResponse(_prometheus(loads),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")
    return JSONResponse({
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "version": VERSION,
        "accelerator": None,
        "num_accelerators": 1,
        "loads": loads,
    })


async def get_load(request: Request) -> Response:
    """GET /get_load, as releases before 0.5.23 served it (`--serve-get-load`)."""
    state: StandinState = request.app.state.standin
    engine = state.engine
    used, pending = engine.token_counts()
    return JSONResponse([{
        "dp_rank": 0,
        "num_reqs": engine.running_count + engine.waiting_count,
        "num_waiting_reqs": engine.waiting_count,
        "num_tokens": used + pending,
        "num_pending_tokens": pending,
        "ts_tic": time.perf_counter(),
    }])


def _prometheus(loads: list[dict]) -> str:
    lines: list[str] = []
    names = [k for k, v in loads[0].items() if isinstance(v, (int, float)) and k != "dp_rank"] if loads else []
    for name in names:
        lines.append(f"# TYPE sglang_{name} gauge")
        lines += [f'sglang_{name}{{dp_rank="{d["dp_rank"]}"}} {d[name]}' for d in loads]
    return "\n".join(lines) + "\n"
