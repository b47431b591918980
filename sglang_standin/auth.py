"""`--api-key`: the bearer-token check real SGLang puts in front of its routes.

Why: a worker fleet must send the key on every call and must still be able to
probe /health without it (k8s and compose health checks carry no secrets).
Rules as in SGLang's `add_api_key_middleware` / `decide_request_auth`
(2026 main): with only `--api-key` set, NORMAL and ADMIN_OPTIONAL endpoints
alike need the key; `--admin-api-key` and ADMIN_FORCE are not modelled.

`POST /standin/api-key {"api_key": "NEW"}` (itself guarded by the current key)
rotates the key in place, a stand-in-only route: the key a real server is
restarted with, without the restart. Its /health never changes, so a client's
health checks cannot see the rotation; only its next guarded call can.
"""

from __future__ import annotations

import json
import secrets

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
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
    untouched and the check costs nothing per token. The key is read from
    `keys` at each request, so a rotation (`rotate`) applies to the next one.
    """

    def __init__(self, app: ASGIApp, keys: ApiKey) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _exempt(scope["method"], scope["path"]):
            auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not _bearer_matches(auth, self.keys.value):
                await errors.unauthorized()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _exempt(method: str, path: str) -> bool:
    return method == "OPTIONS" or path.startswith("/health") or path.startswith("/metrics")


def _bearer_matches(header: str, api_key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), api_key.encode())


class ApiKey:
    """The key in force; only touched from the event loop thread."""

    def __init__(self, value: str) -> None:
        self.value = value


async def rotate(request: Request) -> Response:
    """POST /standin/api-key {"api_key": "NEW"}: the key every guarded route needs from the next
    request on (this one passed the old key's check); 409 on a server started without --api-key."""
    keys: ApiKey | None = request.app.state.standin.api_key
    if keys is None:
        return JSONResponse({"detail": "started without --api-key: nothing to rotate"}, status_code=409)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("api_key"), str) or not body["api_key"]:
        return JSONResponse({"detail": 'expected {"api_key": "NEW"}'}, status_code=400)
    keys.value = body["api_key"]
    return JSONResponse({"rotated": True})  # never the key itself
