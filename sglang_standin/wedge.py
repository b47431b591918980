"""The wedge fault: the engine hangs while the HTTP front still answers.

Why: a GPU server whose scheduler hangs keeps its port open. Connections are
accepted, `/health` may send its head and then only keep-alive bytes, and
`/generate` (and every route that asks the scheduler: `/server_info`, the
load routes) never answers. Only a client with a deadline on each whole call,
and a fleet that cuts the requests it has in flight there, gets past it.

While wedged: `/health` answers 200's head at once and then one byte every
`--wedge-trickle-seconds`, for as long as the wedge lasts; `/generate` and
the scheduler's routes hold the request until the wedge heals or the client
goes away (a request whose client left is dropped, never generated). It is
switched on at start (`--wedge`) or at run time with
`POST /standin/wedge {"wedged": true|false}`, so a test can wedge a server
mid-run and heal it again. Held requests are recorded in the stats
(`wedged`, by prompt key), so a test knows what the server held.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

Route = Callable[[Request], Awaitable[Response]]
_POLL = 0.1  # seconds between looks at the client, while a request is held


class Wedge:
    """The switch; only touched from the event loop thread."""

    def __init__(self, wedged: bool, trickle_seconds: float) -> None:
        self.wedged = wedged
        self.trickle_seconds = trickle_seconds

    async def hold(self, request: Request) -> bool:
        """Wait while wedged; False if the client went away meanwhile (then answer nothing)."""
        while self.wedged:
            if await request.is_disconnected():
                return False
            await asyncio.sleep(_POLL)
        return True

    def health(self) -> Response:
        """200's head now, then a byte every `trickle_seconds` until the wedge heals."""

        async def body() -> AsyncIterator[bytes]:
            while self.wedged:
                yield b"\n"
                await asyncio.sleep(self.trickle_seconds)

        return StreamingResponse(body(), status_code=200, media_type="text/plain")


def held(route: Route) -> Route:
    """A route that asks the scheduler: it answers only once the wedge heals (499 and no answer
    if the client left first)."""

    async def answer(request: Request) -> Response:
        if not await request.app.state.standin.wedge.hold(request):
            return Response(status_code=499)
        return await route(request)

    return answer


async def switch(request: Request) -> Response:
    """POST /standin/wedge {"wedged": bool}: wedge or heal the engine; answers the new state."""
    state = request.app.state.standin
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("wedged"), bool):
        return JSONResponse({"detail": 'expected {"wedged": true|false}'}, status_code=400)
    state.wedge.wedged = body["wedged"]
    return JSONResponse({"wedged": state.wedge.wedged})
