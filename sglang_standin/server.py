"""The Starlette app: routes, API-key check, FastAPI-style 404/405 bodies."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sglang_standin import routes_info as info, routes_load as loads, routes_tokenize
from sglang_standin.auth import ApiKeyMiddleware, rotate
from sglang_standin.config import StandinConfig
from sglang_standin.generate import generate
from sglang_standin.metrics import metrics, registry_for
from sglang_standin.state import StandinState
from sglang_standin.wedge import held, switch


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's default body for 404/405: `{"detail": ...}`."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def routes(cfg: StandinConfig) -> list[Route]:
    """SGLang 0.5.23's routes; /metrics only with --enable-metrics, /get_load (older releases)
    only with --serve-get-load, and the stand-in's own under /standin/."""
    optional = [Route("/metrics", metrics, methods=["GET"])] if cfg.enable_metrics else []
    if cfg.serve_get_load:
        optional.append(Route("/get_load", held(loads.get_load), methods=["GET"]))
    return [*optional,
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/health", info.health, methods=["GET"]),
        Route("/health_generate", info.health, methods=["GET"]),
        Route("/ping", info.ping, methods=["GET"]),
        Route("/model_info", info.model_info, methods=["GET"]),
        Route("/get_model_info", info.model_info, methods=["GET"]),
        Route("/server_info", held(info.server_info), methods=["GET"]),
        Route("/get_server_info", held(info.server_info), methods=["GET"]),
        Route("/v1/loads", held(loads.v1_loads), methods=["GET"]),
        Route("/v1/models", info.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", info.get_model, methods=["GET"]),
        Route("/flush_cache", info.flush_cache, methods=["GET", "POST"]),
        Route("/abort_request", info.abort_request, methods=["POST"]),
        Route("/update_weight_version", info.update_weight_version, methods=["POST"]),
        Route("/tokenize", routes_tokenize.tokenize, methods=["POST"]),
        Route("/v1/tokenize", routes_tokenize.tokenize, methods=["POST"]),
        Route("/standin/stats", info.standin_stats, methods=["GET"]),
        Route("/standin/wedge", switch, methods=["POST"]),
        Route("/standin/api-key", rotate, methods=["POST"]),
    ]


def build_app(cfg: StandinConfig, state: StandinState | None = None) -> Starlette:
    """The ASGI app; `state` is created here unless given (tests may share it)."""
    state = state or StandinState(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await state.engine.close()

    app = Starlette(routes=routes(cfg), exception_handlers={HTTPException: _http_error},
                    lifespan=lifespan)
    app.state.standin = state
    app.state.metrics_registry = registry_for(state)
    if state.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, keys=state.api_key)
    return app
