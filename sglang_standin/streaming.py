"""`"stream": true` answers: Server-Sent Events as SGLang writes them.

Exactly `data: <compact JSON>\\n\\n` per chunk and `data: [DONE]\\n\\n` at the
end, Content-Type text/event-stream. `output_ids` and `text` are CUMULATIVE
(SGLang's default, without --incremental-streaming-output); intermediate
chunks have `finish_reason: null` and no `e2e_latency`. Sub-requests of a
batch interleave, each chunk carrying `"index": i`. Validation errors come
as a `data: {"error": {...}}` chunk with HTTP 200, like SGLang.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

from starlette.responses import StreamingResponse

from sglang_standin.batching import Job
from sglang_standin.responses import Load, Planned, final_body, result_body
from sglang_standin.state import StandinState

DONE = b"data: [DONE]\n\n"


def encode(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def sse_error(message: str) -> StreamingResponse:
    """A ValueError met while streaming: one error chunk, then [DONE]."""
    return _sse([encode({"error": {"message": message}}), DONE])


def sse_single(bodies: list[dict], is_single: bool) -> StreamingResponse:
    """Chunks known in advance (e.g. queue-full aborts), then [DONE]."""
    chunks = [encode(_indexed(b, i, is_single)) for i, b in enumerate(bodies)]
    return _sse(chunks + [DONE])


def _sse(chunks: list[bytes]) -> StreamingResponse:
    async def gen() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk
    return StreamingResponse(gen(), media_type="text/event-stream")


def _indexed(body: dict, i: int, is_single: bool) -> dict:
    if not is_single:
        body["index"] = i
    return body


async def sse_events(state: StandinState, plans: list[Planned], jobs: list[Job], is_single: bool,
                     started: float) -> AsyncIterator[bytes]:
    """Chunks as tokens are produced, woken by each decode step or a finish."""
    engine, cfg = state.engine, state.cfg
    sent = [0] * len(jobs)
    finished = [False] * len(jobs)
    try:
        while True:
            for i, (plan, job) in enumerate(zip(plans, jobs)):
                if finished[i]:
                    continue
                load = Load(engine.running_count, engine.waiting_count)
                if job.outcome.done():
                    finished[i] = True
                    body = final_body(plan, job.outcome.result(), cfg, started, load)
                    yield encode(_indexed(body, i, is_single))
                    continue
                produced = engine.produced(job)
                if produced - sent[i] >= plan.sub.sampling.stream_interval:
                    sent[i] = produced
                    body = result_body(plan, plan.output_ids[:produced], None, cfg, None, load,
                                       job.cached)
                    yield encode(_indexed(body, i, is_single))
            if all(finished):
                break
            pending = {job.outcome for job, f in zip(jobs, finished) if not f}
            await asyncio.wait({engine.progress_signal(), *pending},
                               return_when=asyncio.FIRST_COMPLETED)
        yield DONE
    finally:
        for job in jobs:  # client went away mid-stream: SGLang aborts the request
            engine.cancel(job)
