"""What a 200 answer from `/generate` must be before it counts as a generation.

Invariant: a generation handed to verification, and from there to the shard
writer, has `output_ids` that are all token ids of the run's model (Python
ints, not bools, in `[0, bound)` where the bound is the vocabulary size when
known and 2^31 always, at most `max_new_tokens` of them) and a `meta_info`
whose fields the sample is built from have the types the shard stores. Any
other body (not JSON, cut off at the size cap, the wrong shape or types)
raises `BadOutput`, whose excerpt holds the first `EXCERPT_BYTES` of the body
and the offending values with their positions, never the whole body.

Why it holds: `read_answer` is the only way from bytes to `(output_ids,
meta_info)`, and it checks every entry. Why it matters: a row the schema
cannot store fails the whole group commit, turning every good prompt of that
shard into a crash; refused here, the bad answer harms only its own prompt.
Log-probabilities, where a run asks for them (`read_logprobs`), are held
to the same standard: one entry per output id naming that id, K candidates
a token, numbers where numbers belong (`contract/run/logprobs.py`); and the
answer's size cap grows with K. Pure: bytes in, values or `BadOutput` out, no I/O.
"""
from __future__ import annotations

import json
import math

from contract.run.logprobs import BadLogprobs, Logprobs, from_meta

INT32_LIMIT = 2**31          # shards store ids as int32
EXCERPT_BYTES = 500          # of the body, in a dead letter
MAX_LISTED = 8               # offending values listed in an excerpt
# Longest token of real vocabularies, JSON-encoded with its id: about 140 bytes
# (DeepSeek's 128-dot token); 256 leaves every real answer under the cap.
BYTES_PER_TOKEN = 256
SLACK_BYTES = 64 * 1024      # meta_info and the envelope
# One `[logprob, token_id, null]` entry: a float64's 24 characters at most, an id, the brackets: 40
# bytes; 64 leaves room for the formatting of any server.
BYTES_PER_LOGPROB = 64
_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs")
NO_BUDGET_CAP = 64 * 1024 * 1024


class BadOutput(Exception):
    """A 200 answer that is not a generation of this model; `excerpt` says what was wrong."""

    def __init__(self, message: str, excerpt: dict):
        super().__init__(message)
        self.excerpt = excerpt


def answer_cap(max_new_tokens: int | None, override: int = 0, logprobs: int | None = None) -> int:
    """The most bytes a correct answer for this budget can take (`FLEET_MAX_ANSWER_BYTES` overrides),
    with K + 1 log-probability entries a token where `logprobs` K were asked for."""
    if override > 0:
        return override
    per_token = BYTES_PER_TOKEN + (logprobs + 1) * BYTES_PER_LOGPROB if logprobs else BYTES_PER_TOKEN
    if not max_new_tokens:
        return NO_BUDGET_CAP * per_token // BYTES_PER_TOKEN
    return per_token * max_new_tokens + SLACK_BYTES


def read_logprobs(meta: dict, output_ids: list[int], k: int) -> Logprobs:
    """The answer's top-`k` log-probabilities, which must name `output_ids` token for token
    (`contract/run/logprobs.py`), taken out of `meta` (a long answer's lists are its bulk); or `BadOutput`."""
    try:
        scores = from_meta(meta, output_ids, k)
    except BadLogprobs as exc:
        raise BadOutput(f"log-probabilities: {exc}", {"logprobs_problem": str(exc)[:300],
                                                      "output_len": len(output_ids)}) from None
    for key in _LOGPROB_KEYS:
        meta.pop(key, None)
    return scores


def id_bound(*vocab_sizes: int | None) -> int:
    """The first id that is not a token id: the smallest known vocabulary size, never above int32."""
    return min([v for v in vocab_sizes if v] + [INT32_LIMIT])


def read_answer(body: bytes, *, complete: bool, max_new_tokens: int | None,
                bound: int = INT32_LIMIT) -> tuple[list[int], dict]:
    """`(output_ids, meta_info)` of one non-streaming answer, or `BadOutput`."""
    head = {"body_head": body[:EXCERPT_BYTES].decode("utf-8", "replace"), "body_bytes": len(body)}
    if not complete:
        raise BadOutput(f"answer larger than {len(body)} bytes, the cap for max_new_tokens="
                        f"{max_new_tokens} (FLEET_MAX_ANSWER_BYTES overrides)", {**head, "cap_bytes": len(body)})
    data = _json(body, head)
    if isinstance(data, list) and len(data) == 1:  # a batch answer; we always send one prompt
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("output_ids"), list):
        raise BadOutput("answer is not an object with an output_ids list", head)
    ids, meta = data["output_ids"], data.get("meta_info")
    _check_ids(ids, bound, max_new_tokens, head)
    _check_meta(meta, head)
    return ids, meta


def _json(body: bytes, head: dict) -> object:
    try:
        return json.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise BadOutput(f"answer is not JSON: {exc}", {**head, "json_error": str(exc)[:200]}) from exc


def _check_ids(ids: list, bound: int, max_new_tokens: int | None, head: dict) -> None:
    if max_new_tokens is not None and len(ids) > max_new_tokens:
        raise BadOutput(f"{len(ids)} output_ids for max_new_tokens={max_new_tokens}",
                        {**head, "output_len": len(ids)})
    if not ids or (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < bound):
        return  # the common case, at C speed
    bad = [(i, t) for i, t in enumerate(ids) if type(t) is not int or not 0 <= t < bound]
    listed = [{"position": i, "value": _shown(t)} for i, t in bad[:MAX_LISTED]]
    first = listed[0]
    raise BadOutput(f"output_ids[{first['position']}] = {first['value']!r} is not a token id of this model "
                    f"(ints in [0, {bound})); {len(bad)} such entries",
                    {**head, "bad_ids": listed, "bad_ids_count": len(bad), "output_len": len(ids),
                     "id_bound": bound})


# meta_info fields the sample or verification reads, and the JSON types each may have.
_INT, _NUMBER = (int,), (int, float)
_META_TYPES = {"completion_tokens": _INT, "prompt_tokens": _INT, "e2e_latency": _NUMBER}
_FINISH_TYPES = {"type": (str,), "matched": (int, str), "length": _INT}


def _check_meta(meta: object, head: dict) -> None:
    if not isinstance(meta, dict):
        raise BadOutput(f"meta_info is {type(meta).__name__}, not an object",
                        {**head, "meta_problems": {"meta_info": _shown(meta)}})
    problems = {f"meta_info.{k}": _shown(meta[k]) for k, types in _META_TYPES.items()
                if meta.get(k) is not None and not _typed(meta[k], types)}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        problems.update({f"meta_info.finish_reason.{k}": _shown(finish[k]) for k, types in _FINISH_TYPES.items()
                         if finish.get(k) is not None and not _typed(finish[k], types)})
        matched = finish.get("matched")
        if isinstance(matched, int) and not 0 <= matched < INT32_LIMIT:
            problems["meta_info.finish_reason.matched"] = matched
    elif finish is not None and not isinstance(finish, str):
        problems["meta_info.finish_reason"] = _shown(finish)
    if problems:
        raise BadOutput(f"meta_info has the wrong types: {', '.join(sorted(problems))}",
                        {**head, "meta_problems": problems})


def _typed(value: object, types: tuple[type, ...]) -> bool:
    """JSON typing: a bool is not a number here, and a number must be finite."""
    if isinstance(value, bool) or not isinstance(value, types):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def _shown(value: object) -> object:
    """A value as the excerpt keeps it: JSON-safe and short."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= 80 else text[:80] + "..."
