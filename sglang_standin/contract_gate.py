"""SGLang 0.5.23's JSON contract gate on `/generate`: 400 `{"error": "<serde's text>"}`.

Why: after FastAPI has parsed the body, 0.5.23 checks it against its generated
schema (`sglang/api/v1/api_types.py`, `decode_GenerateRequest`) before any
other code runs. `sampling_params` rejects unknown keys and wrongly typed
values there, with serde's wording: `unknown field \\`max_tokens\\`, expected one
of ...` or `invalid type: floating point \\`3.0\\`, expected i64`. Older
releases crashed with a 500 on an unknown key instead. The body is a plain
string under `error`, unlike the `{"error": {"message"}}` of a ValueError.
Only the fields whose checks a client can meet on the native API are here:
`sampling_params`, and the log-probability fields (`return_logprob`,
`top_logprobs_num`, `logprob_start_len`: one value or a batch's list).
"""

from __future__ import annotations

from typing import Any, Callable

from sglang_standin.errors import ContractError

#: SamplingParams' fields in the schema's order (the order serde lists them in).
SAMPLING_FIELDS: tuple[str, ...] = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
    "watermark", "choice",
)


def _unexpected(v: Any) -> str:
    """serde's `Unexpected` display."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else type(v).__name__


def _expect(accepts: Callable[[Any], bool], expected: str) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if v is not None and not accepts(v):
            raise ContractError(f"invalid type: {_unexpected(v)}, expected {expected}")
    return check


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ints(v: Any) -> None:
    _expect(lambda x: isinstance(x, list), "a sequence")(v)
    for e in v or []:
        _INT(e)


def _strings(v: Any) -> None:
    if isinstance(v, list):
        for e in v:
            _STR(e)
    else:
        _expect(lambda x: isinstance(x, str), "a value or an array of values for StringOrList")(v)


_INT = _expect(_is_int, "i64")
_FLOAT = _expect(_is_number, "f64")
_STR = _expect(lambda x: isinstance(x, str), "a string")
_BOOL = _expect(lambda x: isinstance(x, bool), "a boolean")
_MAP = _expect(lambda x: isinstance(x, dict), "a map")
_SEQ = _expect(lambda x: isinstance(x, list), "a sequence")
_ANY: Callable[[Any], None] = lambda v: None

_CHECKS: dict[str, Callable[[Any], None]] = {
    "max_new_tokens": _INT, "stop": _strings, "stop_token_ids": _ints, "stop_regex": _strings,
    "temperature": _FLOAT, "top_p": _FLOAT, "top_k": _INT, "min_p": _FLOAT, "frequency_penalty": _FLOAT,
    "presence_penalty": _FLOAT, "repetition_penalty": _FLOAT, "min_new_tokens": _INT, "n": _INT,
    "json_schema": _STR, "regex": _STR, "ebnf": _STR, "structural_tag": _STR, "ignore_eos": _BOOL,
    "skip_special_tokens": _BOOL, "spaces_between_special_tokens": _BOOL, "no_stop_trim": _BOOL,
    "stream_interval": _INT, "logit_bias": _MAP, "sampling_seed": _INT, "custom_params": _ANY,
    "beam_width": _INT, "watermark": _MAP, "choice": _SEQ,
}


def unknown_field(key: str) -> str:
    """serde's `unknown_field` text for a SamplingParams key."""
    listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
    return f"unknown field `{key}`, expected one of {listed}"


#: The top-level fields of a request, besides `sampling_params`, that the gate types and a client sends.
_TOP_LEVEL: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "return_logprob": (lambda v: isinstance(v, bool), "BoolOrList", "a boolean"),
    "top_logprobs_num": (_is_int, "Int64OrList", "i64"),
    "logprob_start_len": (_is_int, "Int64OrList", "i64"),
}


def check_request(body: dict) -> None:
    """The fields the gate checks, in the body's order (serde reports the first it meets)."""
    for key, value in body.items():
        if value is None:
            continue
        if key == "sampling_params":
            check_sampling(value)
        elif key in _TOP_LEVEL:
            accepts, name, element = _TOP_LEVEL[key]
            if isinstance(value, list):
                for entry in value:
                    _expect(accepts, element)(entry)
            else:
                _expect(accepts, f"a value or an array of values for {name}")(value)


def check_sampling(params: Any) -> None:
    """One `sampling_params` object (or a batch's list of them); raise ContractError."""
    for one in params if isinstance(params, list) else [params]:
        if one is None:
            continue
        for key, value in one.items():
            check = _CHECKS.get(key)
            if check is None:
                raise ContractError(unknown_field(key))
            check(value)
