"""`--api-key`: the bearer-token check real SGLang puts in front of its routes.

Why: a worker fleet must send the key on every call and must still be able to
probe /health without it (k8s and compose health checks carry no secrets).
Rules as in SGLang's `add_api_key_middleware` / `decide_request_auth`
(2026 main): with only `--api-key` set, NORMAL and ADMIN_OPTIONAL endpoints
alike need the key; `--admin-api-key` and ADMIN_FORCE are not modelled.
"""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_standin import errors


class ApiKeyMiddleware:
    """`--api-key`: like SGLang's `add_api_key_middleware` (NORMAL auth level).

    Every route needs `Authorization: Bearer KEY` except OPTIONS requests and
    paths starting with /health or /metrics (kept open for liveness probes and
    Prometheus). The scheme is matched case-insensitively and the key in
    constant time, as SGLang does; anything else is 401 `{"error": "Unauthorized"}`.
    That includes /ping, the info and load routes and /standin/stats.
    Plain ASGI (not BaseHTTPMiddleware) so streaming responses pass through
    untouched and the check costs nothing per token.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _exempt(scope["method"], scope["path"]):
            auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not _bearer_matches(auth, self.api_key):
                await errors.unauthorized()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _exempt(method: str, path: str) -> bool:
    return method == "OPTIONS" or path.startswith("/health") or path.startswith("/metrics")


def _bearer_matches(header: str, api_key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), api_key.encode())
