"""The trickle fault: a correct body, sent a few bytes at a time over S seconds.

Why: a server (or a congested link, or a stalled proxy) can keep a response
alive by dribbling bytes. A client whose only timeout is per read (httpx's
`read=`) never fires on it, because every read gets a few bytes well within
the limit; only an overall deadline on the whole request bounds it. The
headers (status 200, Content-Length) go out at once, like a normal answer.
"""

from __future__ import annotations

import asyncio
import math
from typing import AsyncIterator

from starlette.responses import StreamingResponse

#: At most this many pieces, so a large body is still spread evenly over S.
MAX_PIECES = 400
#: Pieces are at least this many bytes ("a few bytes at a time").
MIN_PIECE_BYTES = 4


def pieces(content: bytes) -> list[bytes]:
    """Split the body into at most MAX_PIECES pieces of equal size (the last smaller)."""
    if not content:
        return [b""]
    size = max(MIN_PIECE_BYTES, math.ceil(len(content) / MAX_PIECES))
    return [content[i:i + size] for i in range(0, len(content), size)]


def trickle_response(content: bytes, seconds: float, media_type: str = "application/json",
                     status_code: int = 200) -> StreamingResponse:
    """A response whose first piece leaves at once and whose last leaves after `seconds`."""
    parts = pieces(content)
    gap = seconds / (len(parts) - 1) if len(parts) > 1 else 0.0

    async def body() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, part in enumerate(parts):
            if i:  # sleep to an absolute schedule so timer slack does not add up
                await asyncio.sleep(max(0.0, start + i * gap - loop.time()))
            yield part

    return StreamingResponse(body(), status_code=status_code, media_type=media_type,
                             headers={"content-length": str(len(content))})
