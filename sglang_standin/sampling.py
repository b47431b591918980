"""`sampling_params` as SGLang's `SamplingParams(**params).verify()` treats them.

Why it matters: an unknown key (say `max_tokens`, the OpenAI name) or a
wrongly typed value never gets here: SGLang 0.5.23's contract gate answers it
first (`contract_gate`, 400 `{"error": "unknown field ..."}`). Out-of-range
values raise ValueError in `SamplingParams.verify`: HTTP 400
`{"error": {"message": ...}}`, with the value as the client sent it. A client
tested only against a lenient fake would break on the real server, so we are
strict too. Temperature, top_p & co. are validated but do not change the
output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from sglang_standin.errors import InternalError, RequestError

DEFAULT_MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class Sampling:
    """The parts of sampling_params that change what the stand-in answers."""

    max_new_tokens: int | None  # None: explicit null, i.e. up to the context limit
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stream_interval: int = 1
    seed: int | None = None  # sampling_seed: noted in the stats (the stand-in's tokens do not depend on it)


def parse_sampling(params: dict) -> Sampling:
    """Validate like SGLang's `verify`; raise RequestError (400). The contract gate has checked
    keys and types already; a TypeError left here would crash SGLang's handler too (500)."""
    try:
        _verify(params)
        return Sampling(
            max_new_tokens=_max_new_tokens(params),
            stop_token_ids=_stop_ids(params.get("stop_token_ids")),
            ignore_eos=bool(params.get("ignore_eos", False)),
            stream_interval=max(1, int(params.get("stream_interval") or 1)),
            seed=params.get("sampling_seed"),
        )
    except TypeError as exc:  # wrong types crash real SGLang's handler too
        raise InternalError(str(exc)) from exc


def _number(params: dict, key: str, default: float) -> float:
    value = params.get(key)
    value = default if value is None else value  # an explicit null is the default, as in the gate
    if not isinstance(value, Real):
        raise TypeError(f"{key} must be a number, got {value!r}")
    return float(value)


def _verify(params: dict) -> None:
    """The range checks of SamplingParams.verify, with its messages."""
    t = _number(params, "temperature", 1.0)
    _require(math.isfinite(t) and t >= 0,
             f"temperature must be a non-negative finite number, got {params.get('temperature')}.")
    top_p = _number(params, "top_p", 1.0)
    _require(0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {params.get('top_p')}.")
    min_p = _number(params, "min_p", 0.0)
    _require(0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {params.get('min_p')}.")
    top_k = _number(params, "top_k", -1)
    _require(top_k == -1 or top_k >= 1, f"top_k must be -1 (disable) or at least 1, got {top_k:g}.")
    for key in ("frequency_penalty", "presence_penalty"):
        value = _number(params, key, 0.0)
        _require(-2.0 <= value <= 2.0, f"{key} must be in [-2, 2], got {value}.")
    rep = _number(params, "repetition_penalty", 1.0)
    _require(0.0 <= rep <= 2.0, f"repetition_penalty must be in [0, 2], got {rep}.")
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new is not None:
        _require(_number(params, "max_new_tokens", 0) >= 0,
                 f"max_new_tokens must be at least 0, got {max_new}.")
    min_new = _number(params, "min_new_tokens", 0)
    _require(min_new >= 0 and (max_new is None or min_new <= max_new),
             f"min_new_tokens must be in [0, max_new_tokens], got {min_new:g}.")
    grammars = sum(params.get(k) is not None for k in ("regex", "json_schema", "ebnf"))
    _require(grammars <= 1, "Only one of regex, json_schema, or ebnf can be set.")
    n = 1 if params.get("n") is None else params["n"]
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"n must be an integer, got {n!r}")
    _require(n >= 1, f"n must be at least 1, got {n}.")


def _max_new_tokens(params: dict) -> int | None:
    value = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"max_new_tokens must be an integer, got {value!r}")
    return value


def _stop_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise TypeError("stop_token_ids must be a list of integers")
    return tuple(value)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RequestError(message)
