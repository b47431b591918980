"""Turn a `/generate` body into validated sub-requests, in SGLang's order.

The order of checks decides which error a client sees when a request has
several problems, so it follows SGLang 0.5.23: body schema (400 Bad Request),
the JSON contract gate (`contract_gate`: unknown or mistyped sampling keys,
400 `{"error": "..."}`), `GenerateReqInput.normalize_batch_and_arguments`
(400), then per sub-request the tokenizer manager's checks (400: a prompt of
the context length or more; an explicit `max_new_tokens` that with the prompt
exceeds the context, `>`: a total of exactly the context is accepted), then
`SamplingParams.verify()` (400), then the scheduler's (400: a prompt of
`max_req_input_len` = min(context - 1, KV tokens - 1) - 5 tokens or more).
The scheduler then caps the budget at `max_req_len - prompt - 1` without a
word (an answer to a prompt of P tokens in a context of C is at most C - 2 - P
tokens). Ids outside the vocabulary pass every check: see `out_of_vocabulary`.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Callable

from sglang_standin.config import StandinConfig
from sglang_standin.contract_gate import check_request
from sglang_standin.logprobs import LogprobAsk, ask_of
from sglang_standin.errors import RequestError, SchemaError
from sglang_standin.sampling import Sampling, parse_sampling
from sglang_standin.tokenizer import NO_TOKENIZER, StandinTokenizer, load_tokenizer

log = logging.getLogger("sglang_standin")

EMBEDS_UNSUPPORTED = "The SGLang stand-in does not support input_embeds."


@dataclass(frozen=True)
class SubRequest:
    """One prompt of a (possibly batched) /generate call, validated."""

    rid: str
    rid_given: bool
    input_ids: list[int]  # after any auto-truncation
    max_new_tokens: int  # after SGLang's clamp to the context
    sampling: Sampling
    logprob: LogprobAsk | None = None  # `return_logprob` and its companions (`logprobs`); None: not asked


@dataclass(frozen=True)
class GenerateCall:
    items: list[SubRequest]
    is_single: bool
    stream: bool


def parse_generate(body: dict, cfg: StandinConfig) -> GenerateCall:
    """Validate a decoded body; raise ContractError, RequestError or InternalError."""
    check_request(body)
    prompts, is_single, params, rids = _normalize(body, load_tokenizer(cfg.tokenizer_path))
    given_prompts = 1 if is_single else _batch_size(body)
    items = [_sub_request(p, sp, rid, given, cfg, ask_of(body, i * given_prompts // len(prompts)))
             for i, (p, sp, (rid, given)) in enumerate(zip(prompts, params, rids))]
    return GenerateCall(items=items, is_single=is_single, stream=bool(body.get("stream", False)))


def _batch_size(body: dict) -> int:
    """The prompts a batch request gave (before `n` repeats each): a per-prompt list indexes them."""
    ids, text = body.get("input_ids"), body.get("text")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return len(text) if isinstance(text, list) else 1


def require_json(content_type: str | None, raw: bytes) -> bytes:
    """FastAPI (0.165, SGLang 0.5.23's) parses a body as JSON only under an application/json (or
    +json) Content-Type; any other, or none, leaves bytes that the request model refuses."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return raw
    raise SchemaError("1 validation error:\n  {'type': 'dataclass_type', 'loc': ('body',), 'msg': 'Input should "
                      f"be a dictionary or an instance of GenerateReqInput', 'input': {raw[:200]!r}}}")


def load_body(raw: bytes) -> dict:
    """Decode and type-check the JSON body; raise SchemaError."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"1 validation error: body: JSON decode error ({exc})") from exc
    if not isinstance(body, dict):
        raise SchemaError("1 validation error: body: Input should be a valid dictionary")
    _check_types(body)
    return body


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value)


def _one_or_list(value: object, kind: type) -> bool:
    return isinstance(value, kind) or (
        isinstance(value, list) and all(isinstance(x, kind) for x in value))


_PYDANTIC_BOOLS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}


def _lax_int(v: object) -> bool:
    """pydantic's lax int: an int, a float without a fraction, a string of an int."""
    if isinstance(v, bool) or isinstance(v, int):
        return True
    if isinstance(v, float):
        return v.is_integer()
    return isinstance(v, str) and v.strip().lstrip("+-").isdigit()


def _lax_bool(v: object) -> bool:
    """pydantic's lax bool: a bool, 0 or 1, or one of its words (the contract gate then wants a bool)."""
    if isinstance(v, (bool, int, float)):
        return v in (0, 1)
    return isinstance(v, str) and v.strip().lower() in _PYDANTIC_BOOLS


#: field -> (accepts, pydantic-like complaint); None is always accepted.
_FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "input_ids": (lambda v: _is_ids(v) or (isinstance(v, list) and all(_is_ids(x) for x in v)),
                  "Input should be a list of integers or a list of lists of integers"),
    "text": (lambda v: _one_or_list(v, str), "Input should be a valid string or list of strings"),
    "sampling_params": (lambda v: _one_or_list(v, dict),
                        "Input should be a valid dictionary or list of dictionaries"),
    "rid": (lambda v: _one_or_list(v, str), "Input should be a valid string or list of strings"),
    "stream": (lambda v: isinstance(v, bool), "Input should be a valid boolean"),
    "return_logprob": (lambda v: _lax_bool(v) or (isinstance(v, list) and all(map(_lax_bool, v))),
                       "Input should be a valid boolean"),
    "top_logprobs_num": (lambda v: _lax_int(v) or (isinstance(v, list) and all(map(_lax_int, v))),
                         "Input should be a valid integer, got a number with a fractional part"),
    "logprob_start_len": (lambda v: _lax_int(v) or (isinstance(v, list) and all(map(_lax_int, v))),
                          "Input should be a valid integer, got a number with a fractional part"),
}


def _check_types(body: dict) -> None:
    """What pydantic would reject before any SGLang code runs."""
    problems = [f"body.{name}: {complaint}" for name, (accepts, complaint) in _FIELD_TYPES.items()
                if body.get(name) is not None and not accepts(body[name])]
    if problems:
        raise SchemaError(f"{len(problems)} validation error(s): " + "; ".join(problems))


def _normalize(body: dict, tokenizer: StandinTokenizer | None
               ) -> tuple[list[list[int]], bool, list[dict], list[tuple[str, bool]]]:
    """Batch shape, per-item sampling params and rids (normalize_batch_and_arguments)."""
    ids, text, embeds = body.get("input_ids"), body.get("text"), body.get("input_embeds")
    if ids is None and text is None and embeds is None:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if ids is None and text is None:
        raise RequestError(EMBEDS_UNSUPPORTED)
    if ids is None:
        ids = _tokenized(text, tokenizer)
    if len(ids) == 0:
        raise RequestError("input_ids cannot be empty.")
    is_single = isinstance(ids[0], int)
    prompts: list[list[int]] = [ids] if is_single else list(ids)
    if any(len(p) == 0 for p in prompts):
        raise RequestError("input_ids cannot be empty.")
    params = _per_item_params(body.get("sampling_params"), len(prompts))
    n = params[0].get("n", 1) if isinstance(params[0].get("n", 1), int) else 1
    if n > 1:  # parallel sampling: each prompt n times, the response becomes a list
        prompts = [p for p in prompts for _ in range(n)]
        params = [sp for sp in params for _ in range(n)]
        is_single = False
    return prompts, is_single, params, _rids(body.get("rid"), len(prompts), is_single)


def _tokenized(text: str | list[str], tokenizer: StandinTokenizer | None) -> list:
    """`text` input as ids, with the server's tokenizer (SGLang's tokenizer manager does this)."""
    if tokenizer is None:
        raise RequestError(NO_TOKENIZER)
    return tokenizer.encode(text) if isinstance(text, str) else [tokenizer.encode(t) for t in text]


def _per_item_params(sp: dict | list | None, batch: int) -> list[dict]:
    if sp is None:
        return [{} for _ in range(batch)]
    if isinstance(sp, dict):
        return [sp for _ in range(batch)]
    if len(sp) != batch:
        raise RequestError("The length of sampling_params must match the batch size.")
    return list(sp)


def _rids(rid: str | list | None, batch: int, is_single: bool) -> list[tuple[str, bool]]:
    """(rid, given) per item: given string rids get `_i` suffixes in batches."""
    if rid is None:
        return [(uuid.uuid4().hex, False) for _ in range(batch)]
    if isinstance(rid, str):
        return [(rid, True)] if is_single else [(f"{rid}_{i}", True) for i in range(batch)]
    if is_single or len(rid) != batch:
        raise RequestError("The specified rids length mismatch with the batch_size for batch processing.")
    dups = sorted({r for r in rid if rid.count(r) > 1})
    if dups:
        raise RequestError(f"Duplicate request IDs detected within the request: {dups}")
    return [(r, True) for r in rid]


def _sub_request(ids: list[int], params: dict, rid: str, given: bool, cfg: StandinConfig,
                 logprob: LogprobAsk | None = None) -> SubRequest:
    ids = _check_context(ids, cfg)
    params = dict(params)  # may be shared by a batch; _check_total edits it
    requested = params.get("max_new_tokens")
    if requested is not None:
        _check_total(len(ids), requested, params, cfg)
    sampling = parse_sampling(params)
    ids = _check_input_len(ids, cfg)
    if cfg.oov_ids == "reject" and out_of_vocabulary(ids, cfg):
        raise RequestError(f"The input_ids contain ids outside the vocabulary [0, {cfg.vocab_size}) "
                           "(the stand-in's --oov-ids reject; SGLang 0.5.23 exits instead).")
    budget = 1 << 30 if sampling.max_new_tokens is None else sampling.max_new_tokens
    max_new = max(0, min(budget, cfg.max_req_len - len(ids) - 1))  # the scheduler's silent cap
    return SubRequest(rid=rid, rid_given=given, input_ids=ids, max_new_tokens=max_new, sampling=sampling,
                      logprob=logprob)


def out_of_vocabulary(ids: list[int], cfg: StandinConfig) -> bool:
    """An id the model's embedding has no row for (negative ones too): SGLang 0.5.23 checks
    none, and its scheduler dies on the embedding's IndexError (`generate.crash_on_oov`)."""
    return bool(ids) and (min(ids) < 0 or max(ids) >= cfg.vocab_size)


def _check_context(ids: list[int], cfg: StandinConfig) -> list[int]:
    """The tokenizer manager's check: a prompt of the context length or more (may cut it)."""
    n, c = len(ids), cfg.context_len
    if n < c:
        return ids
    if not cfg.allow_auto_truncate:
        raise RequestError(f"The input ({n} tokens) is longer than the model's context length ({c} tokens).")
    # Like SGLang, keep the FIRST ids (the chat template's tail is what gets lost).
    log.warning("The input (%d tokens) is longer than the model's context length (%d tokens). "
                "Truncating the input.", n, c)
    return ids[:c]


def _check_total(n: int, requested: int, params: dict, cfg: StandinConfig) -> None:
    """SGLang rejects an explicit max_new_tokens that, with the prompt, exceeds the context
    (its tokenizer manager's `max_new_tokens + input_token_num > context_len`)."""
    c = cfg.context_len
    if requested + n <= c:
        return
    if cfg.allow_auto_truncate:
        log.warning("Requested token count (%d input + %s new) exceeds the model's context length "
                    "(%d tokens). Truncating max_new_tokens.", n, requested, c)
        params["max_new_tokens"] = max(0, c - n)
        return
    raise RequestError(
        f"Requested token count exceeds the model's maximum context length of {c} tokens. "
        f"You requested a total of {requested + n} tokens: {n} tokens from the input messages "
        f"and {requested} tokens for the completion. Please reduce the number of tokens in the "
        "input messages or the completion to fit within the limit."
    )


def _check_input_len(ids: list[int], cfg: StandinConfig) -> list[int]:
    """The scheduler's `validate_input_length`: a prompt of `max_req_input_len` tokens or more."""
    limit = cfg.max_req_input_len
    if len(ids) < limit:
        return ids
    if cfg.allow_auto_truncate:
        log.warning("Request length is longer than the KV cache pool size or the max context length. "
                    "Truncated. len(req.origin_input_ids)=%d, max_req_input_len=%d.", len(ids), limit)
        return ids[:limit]
    raise RequestError(f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({limit} tokens). "
                       "Use a shorter input or enable --allow-auto-truncate.")
