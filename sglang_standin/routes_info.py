"""Health, info and admin routes, with SGLang's bodies and status codes.

Health is the subtle one: 200 with an EMPTY body (no "ok"), 503 with an empty
body while warming up or shutting down, and a healthy answer takes about a
second (SGLang sleeps 1 s while its probe generation runs).
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from sglang_standin import errors
from sglang_standin.state import StandinState

VERSION = "0.5.23"  # the SGLang release whose answers the stand-in gives (tests/real/test_standin_contract.py)
FLUSH_MESSAGE = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


def _state(request: Request) -> StandinState:
    return request.app.state.standin


async def health(request: Request) -> Response:
    """GET /health and /health_generate."""
    state = _state(request)
    if not state.lifecycle.healthy:
        return Response(status_code=503)
    if state.wedge.wedged:
        return state.wedge.health()
    await asyncio.sleep(state.cfg.health_latency)
    return Response(status_code=200)


async def ping(request: Request) -> Response:
    return Response(status_code=200)


async def model_info(request: Request) -> Response:
    """GET /model_info and /get_model_info. No context length here (see /v1/models)."""
    cfg = _state(request).cfg
    return JSONResponse({
        "model_path": cfg.model_path,
        "served_model_name": cfg.served_model_name,
        "tokenizer_path": cfg.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": cfg.weight_version,
        "load_format": "auto",
        "reasoning_parser": cfg.reasoning_parser,
        "tool_call_parser": None,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
    })


def server_args(state: StandinState) -> dict:
    """The ServerArgs-like part of /server_info (api_key never echoed). As SGLang's arguments,
    `context_length`, `max_running_requests` and `max_total_tokens` are null unless given."""
    cfg = state.cfg
    return {
        "model_path": cfg.model_path, "tokenizer_path": cfg.tokenizer_path,
        "host": cfg.host, "port": cfg.port, "context_length": cfg.context_length,
        "served_model_name": cfg.served_model_name, "reasoning_parser": cfg.reasoning_parser,
        "tool_call_parser": None, "allow_auto_truncate": cfg.allow_auto_truncate,
        "max_running_requests": cfg.max_running_requests, "max_total_tokens": cfg.max_total_tokens,
        "max_queued_requests": cfg.max_queued_requests, "skip_tokenizer_init": False,
        "enable_metrics": cfg.enable_metrics,
        "skip_server_warmup": cfg.warmup_seconds == 0, "tp_size": 1, "dp_size": 1,
        "stream_interval": 1, "incremental_streaming_output": False,
        "weight_version": state.launch_weight_version or cfg.weight_version, "api_key": None,
    }


async def server_info(request: Request) -> Response:
    """GET /server_info and /get_server_info: server args + scheduler info + internal_states.

    The limits in force are `max_total_num_tokens`, `max_req_input_len` (the
    longest prompt is one less) and, in `internal_states` (one entry: one DP
    rank), `effective_max_running_requests_per_dp`. No context length here
    unless given (see /v1/models).
    """
    state = _state(request)
    args = server_args(state)
    cfg = state.cfg
    max_total = cfg.max_total_num_tokens
    internal = {**args, "last_gen_throughput": 0.0,
                "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": max_total, "graph": 0.0},
                "effective_max_running_requests_per_dp": cfg.max_running}
    return JSONResponse({**args, "status": "ready", "max_total_num_tokens": max_total,
                         "max_req_input_len": cfg.max_req_input_len,
                         "internal_states": [internal], "version": VERSION})


def _model_card(state: StandinState) -> dict:
    name = state.cfg.served_model_name
    return {"id": name, "object": "model", "created": state.created, "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": state.cfg.context_len}


async def list_models(request: Request) -> Response:
    """GET /v1/models: the easiest place to read the context length."""
    return JSONResponse({"object": "list", "data": [_model_card(_state(request))]})


async def get_model(request: Request) -> Response:
    """GET /v1/models/{model}."""
    state, name = _state(request), request.path_params["model"]
    if name == state.cfg.served_model_name:
        return JSONResponse(_model_card(state))
    return JSONResponse({"error": {"message": f"The model '{name}' does not exist",
                                   "type": "invalid_request_error", "param": "model",
                                   "code": "model_not_found"}}, status_code=404)


async def flush_cache(request: Request) -> Response:
    """Empties the prefix cache as SGLang resets its radix tree: only when nothing runs or waits."""
    engine = _state(request).engine
    if engine.running_count == 0 and engine.waiting_count == 0:
        engine.cache.clear()
    return PlainTextResponse(FLUSH_MESSAGE)


async def abort_request(request: Request) -> Response:
    """POST /abort_request {"rid": ...} or {"abort_all": true}: 200, empty body."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    engine = _state(request).engine
    if body.get("abort_all"):
        engine.abort(None)
    elif isinstance(body.get("rid"), str) and body["rid"]:
        engine.abort(body["rid"])
    return Response(status_code=200)


async def update_weight_version(request: Request) -> Response:
    """POST /update_weight_version {"new_version": ..., "abort_all_requests": true}: what an RL loop
    calls after pushing new weights. From then on /model_info and every answer report the new
    version, while /server_info keeps the launch value, as SGLang 0.5.23 does (the stand-in's config
    is the one setting changed at run time). Requests in flight are aborted first unless
    `abort_all_requests` is false."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        return errors.schema_error(f"1 validation error: body: JSON decode error ({exc})")
    version = body.get("new_version") if isinstance(body, dict) else None
    if not isinstance(version, str):
        return errors.schema_error("1 validation error: body.new_version: Field required (a string)")
    state = _state(request)
    if body.get("abort_all_requests", True):
        state.engine.abort(None)
    if state.launch_weight_version is None:
        state.launch_weight_version = state.cfg.weight_version
    object.__setattr__(state.cfg, "weight_version", version)
    return JSONResponse({"success": True, "message": f"Weight version updated to {version}",
                         "new_version": version})


async def standin_stats(request: Request) -> Response:
    """GET /standin/stats: stand-in only counters for tests and benchmarks."""
    state = _state(request)
    return JSONResponse(state.stats.snapshot(state.engine.running_count, state.engine.waiting_count))
