"""`GET /v1/loads` and `GET /get_load`: live load, in SGLang's field names and shapes.

Why: routers and clients poll these to see how busy a server is before
sending more. The shapes follow sgl-project/sglang at commit
5b49fe622b0218973e43819b1114b3a429d797f9 (early 2026, `entrypoints/v1_loads.py`
and `managers/io_struct.py` `GetLoadsReqOutput` there): `/v1/loads` is
`{timestamp, version, dp_rank_count, loads: [...], aggregate: {...}}`, each
load the dataclass without None fields and without its float timestamp,
plus `num_total_reqs`. `/get_load` (deprecated) is the list that 2026 main's
legacy shim projects from the same numbers: `[{dp_rank, num_reqs,
num_waiting_reqs, num_tokens, num_pending_tokens, ts_tic}]` with
`num_reqs = running + waiting` and `ts_tic` a `time.perf_counter()` value.

The stand-in has one DP rank (0). Its "GPU" numbers are modelled:
`max_total_num_tokens = context_length * max_running_requests`, used tokens
are prompt + produced tokens of running requests, `utilization` is the
token usage, `gen_throughput` tokens per busy second, cache hits 0.
`?format=prometheus` answers the core fields as Prometheus text.
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
#: The "core" fields, in GetLoadsReqOutput order (also the Prometheus gauges).
#: Of the optional sections only memory and queues exist here (no spec/lora/disagg).
_CORE_FIELDS = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens",
                "token_usage", "gen_throughput", "cache_hit_rate", "utilization",
                "max_running_requests")


def rank_load(state: StandinState, include: set[str]) -> dict:
    """One `loads` entry (dp rank 0), sections as `include` asks."""
    cfg, engine = state.cfg, state.engine
    used, _pending = engine.token_counts()
    capacity = cfg.max_total_num_tokens
    usage = round(used / capacity, 4) if capacity else 0.0
    busy = state.stats.busy_seconds()
    load: dict = {
        "dp_rank": 0,
        "num_running_reqs": engine.running_count,
        "num_waiting_reqs": engine.waiting_count,
        "num_used_tokens": used,
        "max_total_num_tokens": capacity,
        "token_usage": usage,
        "gen_throughput": round(state.stats.tokens_generated / busy, 2) if busy > 0 else 0.0,
        "cache_hit_rate": 0.0,
        "utilization": usage,
        "max_running_requests": cfg.max_running_requests,
    }
    if include & {"all", "memory"}:
        load["memory"] = {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0,
                          "token_capacity": capacity}
    if include & {"all", "queues"}:
        load["queues"] = {"waiting": engine.waiting_count, "grammar": 0, "paused": 0,
                          "retracted": 0}
    load["num_total_reqs"] = load["num_running_reqs"] + load["num_waiting_reqs"]
    return load


def aggregate(loads: list[dict]) -> dict:
    """`_compute_aggregate` of v1_loads.py."""
    if not loads:
        return {"total_running_reqs": 0, "total_waiting_reqs": 0, "total_reqs": 0,
                "avg_token_usage": 0.0, "avg_throughput": 0.0, "avg_utilization": 0.0}
    n = len(loads)
    return {
        "total_running_reqs": sum(d["num_running_reqs"] for d in loads),
        "total_waiting_reqs": sum(d["num_waiting_reqs"] for d in loads),
        "total_reqs": sum(d["num_running_reqs"] + d["num_waiting_reqs"] for d in loads),
        "avg_token_usage": round(sum(d["token_usage"] for d in loads) / n, 4),
        "avg_throughput": round(sum(d["gen_throughput"] for d in loads) / n, 2),
        "avg_utilization": round(sum(d["utilization"] for d in loads) / n, 4),
    }


async def v1_loads(request: Request) -> Response:
    """GET /v1/loads[?dp_rank=N][&include=a,b][&format=json|prometheus]."""
    state: StandinState = request.app.state.standin
    params = request.query_params
    include = {s.strip() for s in params["include"].split(",")} if params.get("include") else {"all"}
    invalid = include - VALID_SECTIONS
    if invalid:  # a ValueError in SGLang, re-raised as HTTPException(400): the ErrorResponse body
        return errors.service_error(f"Invalid include sections: {invalid}. "
                                    f"Valid options: {sorted(VALID_SECTIONS)}", 400)
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
        "dp_rank_count": len(loads),
        "loads": loads,
        "aggregate": aggregate(loads),
    })


async def get_load(request: Request) -> Response:
    """GET /get_load (deprecated in SGLang, still served)."""
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
    for name in _CORE_FIELDS:
        lines.append(f"# TYPE sglang_{name} gauge")
        lines += [f'sglang_{name}{{dp_rank="{d["dp_rank"]}"}} {d[name]}' for d in loads]
    return "\n".join(lines) + "\n"
