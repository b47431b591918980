"""The Starlette app: routes, API-key check, FastAPI-style 404/405 bodies."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_standin import errors, routes_info as info
from sglang_standin.config import StandinConfig
from sglang_standin.generate import generate
from sglang_standin.state import StandinState


class ApiKeyMiddleware:
    """`--api-key`: every route but /health* and /ping needs `Bearer KEY`.

    Plain ASGI (not BaseHTTPMiddleware) so streaming responses pass through
    untouched and the check costs nothing per token.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _exempt(scope["path"]):
            auth = dict(scope["headers"]).get(b"authorization")
            if auth != self.expected:
                await errors.unauthorized()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _exempt(path: str) -> bool:
    return path.startswith("/health") or path == "/ping"


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's default body for 404/405: `{"detail": ...}`."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def routes() -> list[Route]:
    return [
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/health", info.health, methods=["GET"]),
        Route("/health_generate", info.health, methods=["GET"]),
        Route("/ping", info.ping, methods=["GET"]),
        Route("/model_info", info.model_info, methods=["GET"]),
        Route("/get_model_info", info.model_info, methods=["GET"]),
        Route("/server_info", info.server_info, methods=["GET"]),
        Route("/get_server_info", info.server_info, methods=["GET"]),
        Route("/v1/models", info.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", info.get_model, methods=["GET"]),
        Route("/flush_cache", info.flush_cache, methods=["GET", "POST"]),
        Route("/abort_request", info.abort_request, methods=["POST"]),
        Route("/standin/stats", info.standin_stats, methods=["GET"]),
    ]


def build_app(cfg: StandinConfig, state: StandinState | None = None) -> Starlette:
    """The ASGI app; `state` is created here unless given (tests may share it)."""
    state = state or StandinState(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await state.engine.close()

    app = Starlette(routes=routes(), exception_handlers={HTTPException: _http_error},
                    lifespan=lifespan)
    app.state.standin = state
    if cfg.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=cfg.api_key)
    return app
