"""`POST /generate`: validate, decide the outputs, schedule, answer.

Everything about a prompt's answer (tokens, finish reason, fault, bad-output
kind) is decided up front by the pure functions in `outputs` and
`bad_outputs`; the scheduler only decides WHEN it is answered (or how much
was produced when it is aborted), and `delivery` how the bytes go out.

A rid given by the client that a request in flight already holds is refused
with 400 "Duplicate request ID detected: <rid>", as SGLang's tokenizer manager
refuses it (a client retrying a request that still runs meets this).

An input id outside the vocabulary passes every check of SGLang 0.5.23 and
kills its scheduler; every process of the server then exits and the request's
connection drops with no answer. The stand-in does the same (`crash_on_oov`),
unless started with `--oov-ids reject`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sglang_standin import errors
from sglang_standin.bad_outputs import bad_output_kind
from sglang_standin.batching import Job
from sglang_standin.config import StandinConfig
from sglang_standin.delivery import deliver
from sglang_standin.outputs import fault_for, for_seed, generate_output, prompt_key
from sglang_standin.request_model import (GenerateCall, SubRequest, load_body, out_of_vocabulary,
                                           parse_generate, require_json)
from sglang_standin.responses import Load, Planned, final_body, queue_full_stream_body
from sglang_standin.state import StandinState
from sglang_standin.streaming import sse_error, sse_events, sse_single

log = logging.getLogger("sglang_standin")
DISCONNECT_POLL_SECONDS = 4.0  # SGLang 0.5.23's SGLANG_REQUEST_STATE_WAIT_TIMEOUT


async def generate(request: Request) -> Response:
    """The route: POST or PUT /generate."""
    state: StandinState = request.app.state.standin
    state.stats.note_request()
    started = time.perf_counter()
    try:
        body = load_body(require_json(request.headers.get("content-type"), await request.body()))
    except errors.SchemaError as exc:
        return errors.schema_error(str(exc))
    stream = body.get("stream") is True
    try:
        call = parse_generate(body, state.cfg)
    except errors.ContractError as exc:
        return errors.contract_error(str(exc))
    except errors.RequestError as exc:
        return sse_error(str(exc)) if stream else errors.value_error(str(exc))
    except errors.InternalError as exc:
        log.error("Exception in /generate (real SGLang answers 500 too): %s", exc)
        return errors.internal_error()
    given = {sub.rid for sub in call.items if sub.rid_given}
    if given & state.rids:  # the tokenizer manager's check, before the scheduler sees the ids
        return errors.value_error(f"Duplicate request ID detected: {sorted(given & state.rids)[0]}")
    if state.cfg.oov_ids == "crash" and any(out_of_vocabulary(sub.input_ids, state.cfg) for sub in call.items):
        crash_on_oov(state.cfg.vocab_size)
    plans = [plan(sub, state.cfg) for sub in call.items]
    for index, p in enumerate(plans):
        state.stats.note_asked(p.key, asked(body, index))
    state.rids |= given
    try:  # (a stream's rids are let go when its response starts: the fleet does not stream)
        if not await _unwedged(request, state, plans):
            return Response(status_code=499)
        return await _schedule_and_answer(request, state, call, plans, started)
    finally:
        state.rids -= given


ASKED_FIELDS = ("return_logprob", "top_logprobs_num", "logprob_start_len")


def asked(body: dict, index: int) -> dict:
    """Sub-request `index`'s sampling_params and log-probability fields, as the client sent them."""
    params = body.get("sampling_params")
    if isinstance(params, list):
        params = params[index] if index < len(params) else None
    return {"sampling_params": params, **{k: body[k] for k in ASKED_FIELDS if k in body}}


def crash_on_oov(vocab_size: int) -> None:
    """End the whole server at once, as SGLang 0.5.23 does: its scheduler dies on the embedding's
    IndexError and the launcher kills its process tree (SIGKILL, so no socket gets an answer)."""
    log.error("Scheduler hit an exception: IndexError: index out of range in self (an input id outside "
              "[0, %d); the stand-in exits as SGLang 0.5.23 does, see --oov-ids)", vocab_size)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def plan(sub: SubRequest, cfg: StandinConfig) -> Planned:
    """Decide a sub-request's key, fault, bad-output kind and full output (drawn with its
    sampling_seed under --seeded-outputs: `outputs.for_seed`)."""
    cfg = for_seed(cfg, sub.sampling.seed)
    ids, finish = generate_output(sub.input_ids, sub.max_new_tokens, cfg,
                                  sub.sampling.stop_token_ids, sub.sampling.ignore_eos)
    key = sub.rid if sub.rid_given else prompt_key(sub.input_ids)
    return Planned(sub=sub, key=key, fault=fault_for(sub.input_ids, cfg), output_ids=ids,
                   finish=finish, bad_kind=bad_output_kind(sub.input_ids, cfg))


async def _unwedged(request: Request, state: StandinState, plans: list[Planned]) -> bool:
    """Hold the request while the engine is wedged (noted in the stats); False if its client left."""
    if state.wedge.wedged:
        for p in plans:
            state.stats.note_wedged(p.key)
    return await state.wedge.hold(request)


async def _outcomes(request: Request, state: StandinState, jobs: list[Job]) -> list | None:
    """The jobs' outcomes; None when the client left first. As SGLang's tokenizer manager, which looks
    every `SGLANG_REQUEST_STATE_WAIT_TIMEOUT` (4 s) while a non-streaming request waits, the jobs of
    a client that disconnected are aborted (and their rids free for its next try)."""
    pending = asyncio.gather(*(job.outcome for job in jobs))
    while True:
        try:
            return await asyncio.wait_for(asyncio.shield(pending), DISCONNECT_POLL_SECONDS)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                log.info("Request is disconnected from the client side: aborting %s", [job.rid for job in jobs])
                for job in jobs:
                    state.engine.cancel(job)
                return None


async def _schedule_and_answer(request: Request, state: StandinState, call: GenerateCall,
                               plans: list[Planned], started: float) -> Response:
    first = [state.stats.note_attempt(p.key) == 1 for p in plans]
    if any(f and p.fault == "http500_first" for p, f in zip(plans, first)):
        log.error("Injected fault: HTTP 500 on the first request for this prompt")
        return errors.internal_error()
    queue_full = any(f and p.fault == "queue_full_first" for p, f in zip(plans, first))
    delay = state.cfg.slow_seconds
    jobs = [Job(p.sub.rid, p.sub.input_ids, p.output_ids,
                delay if p.fault == "slow" else 0.0) for p in plans]
    if queue_full or not state.engine.submit(jobs):
        if call.stream:
            return sse_single([queue_full_stream_body(p, started) for p in plans], call.is_single)
        return errors.queue_full()
    for p in plans:
        state.stats.note_generation(p.key, p.sub.sampling.seed)
    if call.stream:  # uvicorn's own shutdown waits for open streams to finish
        events = sse_events(state, plans, jobs, call.is_single, started)
        return StreamingResponse(events, media_type="text/event-stream")
    lifecycle = state.lifecycle
    lifecycle.inflight += 1
    try:
        outcomes = await _outcomes(request, state, jobs)
        if outcomes is None or not await _unwedged(request, state, plans):  # client gone, or engine wedged
            return Response(status_code=499)
    finally:
        lifecycle.inflight -= 1
        for p in plans:
            state.stats.note_answered(p.key)
    load = Load(state.engine.running_count, state.engine.waiting_count)
    bodies = [final_body(p, o, state.cfg, started, load) for p, o in zip(plans, outcomes)]
    return deliver(plans, bodies, call.is_single, state.cfg, state.stats)

