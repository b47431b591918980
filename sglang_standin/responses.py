"""The `/generate` result object: `{"text", "output_ids", "meta_info"}`.

Key set, order and types are SGLang 0.5.23's (measured on the real server,
kept so by tests/real/test_standin_contract.py): the eos or matched stop id
stays in `output_ids` and counts in `completion_tokens`, while `text` drops
it (SGLang's `trim_matched_stop`); `cached_tokens_details` is null without a
prefix-cache hit and `{"device": n, "host": 0}` with one; the scheduler's
and tokenizer manager's timestamps (`queue_time`, `first_token_latency`, ...)
come only with `--enable-metrics`, as there. With a tokenizer
(`--tokenizer-path`, a local folder) `text` is the decoded output; without,
a placeholder, `t<id>` per token, so it is deterministic too.

2026 main builds (not 0.5.23) also copy the scheduler's load into every
answer ("so clients can do response-based flow control without polling
/v1/loads"): `num_running_reqs` and `num_waiting_reqs` right after
`num_retractions`. Only with `--meta-info-load`; the stand-in passes its
engine's counts at the moment the body is built (`Load`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

from sglang_standin.batching import Outcome
from sglang_standin.config import StandinConfig
from sglang_standin.logprobs import logprob_meta
from sglang_standin.outputs import ABORT_FINISH
from sglang_standin.request_model import SubRequest
from sglang_standin.tokenizer import load_tokenizer

WAITING_ABORT: dict = {"type": "abort", "message": "Abort in waiting queue"}


class Load(NamedTuple):
    """The scheduler's queue sizes, as 2026 SGLang reports them in meta_info."""

    num_running_reqs: int
    num_waiting_reqs: int


@dataclass
class Planned:
    """A sub-request with everything decided up front: key, fault, tokens."""

    sub: SubRequest
    key: str  # per-prompt key for stats and first-attempt faults
    fault: str | None
    output_ids: list[int]  # what it will produce if it runs to the end
    finish: dict
    bad_kind: str | None = None  # bad-output kind (fault "bad_output"), applied on delivery


def placeholder_text(output_ids: list[int], finish: dict | None, cfg: StandinConfig) -> str:
    """The detokenized text (a deterministic placeholder without a tokenizer)."""
    ids = output_ids
    if finish and finish.get("type") == "stop" and ids and ids[-1] == finish.get("matched"):
        ids = ids[:-1]  # SGLang trims a matched stop token from the text
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    if tokenizer is not None:
        return tokenizer.decode([i for i in ids if isinstance(i, int) and 0 <= i < cfg.vocab_size])
    return " ".join(f"t{i}" for i in ids if i != cfg.eos_id)  # eos is special: skipped


def reasoning_tokens(output_ids: list[int], cfg: StandinConfig) -> int:
    """0 without a reasoning parser; else tokens up to and including think-end."""
    if not cfg.reasoning_parser:
        return 0
    try:
        return output_ids.index(cfg.think_end_id) + 1
    except ValueError:
        return len(output_ids)  # still reasoning (deepseek-r1 forces reasoning mode)


def result_body(plan: Planned, ids: list[int], finish: dict | None, cfg: StandinConfig,
                started: float | None, load: Load | None = None, cached: int = 0) -> dict:
    """One result object; `started` (perf_counter) None marks a stream chunk.

    `cached` is the prompt's prefix-cache hit when it was scheduled (`prefix_cache`).
    """
    completion = len(ids) + (1 if plan.fault == "count_mismatch" else 0)
    meta: dict = {
        "id": plan.sub.rid,
        "finish_reason": finish,
        "prompt_tokens": len(plan.sub.input_ids),
        "weight_version": cfg.weight_version,
        "num_retractions": 0,
        **(load._asdict() if load is not None and cfg.meta_info_load else {}),
        **(logprob_meta(plan.sub.logprob, plan.sub.input_ids, ids, cfg.vocab_size) if plan.sub.logprob else {}),
        **(_scheduler_times() if cfg.enable_metrics else {}),
        "reasoning_tokens": reasoning_tokens(ids, cfg),
        "completion_tokens": completion,
        "cached_tokens": cached,
        "weight_versions": [{"version": cfg.weight_version, "start": 0, "end": len(ids)}],
        "cached_tokens_details": {"device": cached, "host": 0} if cached else None,
        "dp_rank": None,
    }
    if started is not None:
        meta["e2e_latency"] = time.perf_counter() - started
        if cfg.enable_metrics:
            meta.update(_request_times(meta["e2e_latency"], len(ids)))
    meta["response_sent_to_client_ts"] = time.time()
    return {"text": placeholder_text(ids, finish, cfg), "output_ids": list(ids), "meta_info": meta}


def _scheduler_times() -> dict:
    """The scheduler's timestamps that 0.5.23 reports only with --enable-metrics."""
    wall = time.time()
    return {"storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0, "forward_entry_time": wall,
            "prefill_finished_time": wall, "queue_time": 0.0}


def _request_times(elapsed: float, produced: int) -> dict:
    """The tokenizer manager's times that 0.5.23 reports only with --enable-metrics."""
    wall = time.time()
    return {"request_received_ts": wall - elapsed, "first_token_latency": elapsed,
            "api_server_dispatch_finish_ts": wall - elapsed, "request_finished_ts": wall,
            "decode_throughput": produced / elapsed if elapsed > 0 and produced else 0.0}


def final_body(plan: Planned, outcome: Outcome, cfg: StandinConfig, started: float,
               load: Load | None = None) -> dict:
    """The finished result, honouring aborts from /abort_request."""
    if outcome.aborted == "waiting":  # SGLang sends a reduced meta_info here
        return {"text": "", "output_ids": [], "meta_info": {
            "id": plan.sub.rid, "finish_reason": dict(WAITING_ABORT), "weight_version": cfg.weight_version,
            "e2e_latency": time.perf_counter() - started, "completion_tokens": 0,
            "response_sent_to_client_ts": time.time()}}
    if outcome.aborted == "running":
        return result_body(plan, plan.output_ids[: outcome.produced], dict(ABORT_FINISH), cfg,
                           started, load, outcome.cached)
    return result_body(plan, plan.output_ids, plan.finish, cfg, started, load, outcome.cached)


def queue_full_stream_body(plan: Planned, started: float) -> dict:
    """In a stream, a queue-full abort arrives as a normal chunk (HTTP 200)."""
    finish = {"type": "abort", "message": "The request queue is full.", "status_code": 503,
              "err_type": None}
    return {"text": "", "output_ids": [], "meta_info": {
        "id": plan.sub.rid, "finish_reason": finish, "prompt_tokens": len(plan.sub.input_ids),
        "weight_version": "default", "completion_tokens": 0,
        "e2e_latency": time.perf_counter() - started, "response_sent_to_client_ts": time.time()}}
