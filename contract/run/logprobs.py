"""`enqueue --logprobs K`: the top-K log-probabilities of each output token, beside the tokens.

Distilling a model into a smaller one learns better from the teacher's
distribution than from its one sampled token; SGLang gives the top K of it with
each token when asked. Opt-in, because it costs: the answer grows by about
33 bytes a token per entry, and a shard by about 5.5 bytes a token per
candidate (K = 20: 118.6 bytes an output token, against 4.3 without; measured
in docs/data/shards.md).

**The request.** Top-level fields of `/generate`, not sampling parameters:
`return_logprob: true`, `top_logprobs_num: K`, `logprob_start_len: -1` (output
tokens only: the prompt's own log-probabilities would cost a prefill pass's
worth of entries for nothing a trainer reads). SGLang 0.5.23 sets no upper bound
on K; the fleet takes 1 to `MAX_LOGPROBS` (OpenAI's bound, which SGLang's own
OpenAI route applies), so a shard's size stays bounded by the run's budget.

**The answer** (`meta_info`, SGLang 0.5.23, checked against the real server by
tests/real/test_standin_contract.py): `output_token_logprobs`, one
`[logprob, token_id, text]` per output token (text null unless
`return_text_in_logprobs`), the token id that of `output_ids` at the same
position; `output_top_logprobs`, per output token a list of K such entries,
most likely first; `output_token_logprobs_length`; `input_token_logprobs` and
`input_top_logprobs` (empty with `logprob_start_len: -1`). An answer of no
token (a budget of 0) still has one top list, the distribution after the
prompt. A logprob is null on
the wire where it was not finite (JSON has no -inf), stored as -inf. They are the
log-probabilities SGLang samples from: after the temperature (the raw model's
for a greedy request, or on a server started with `SGLANG_RETURN_ORIGINAL_LOGPROB=1`),
before top-p, top-k and min-p cut the distribution.

**A mismatch is the server's fault.** An answer whose entries do not name
`output_ids`, token for token, or that has fewer or more than K top entries at
a position, or none at all where asked, is a bad answer (`BadOutput`): retried
like any other, then dead-lettered as `bad_output`. The stored log-probabilities
are thereby those of the stored tokens.

**Stored compactly** (`contract/storage/schema.py`), three list columns of a row, null
in a run without `--logprobs`:
- `logprobs` (list<float32>, `output_len` entries): the log-probability of each
  output token, `output_ids[i]` = `input_ids[prompt_len + i]`;
- `top_logprob_ids` (list<int32>) and `top_logprobs` (list<float32>),
  `output_len * K` entries each, flattened row-major: the K candidates of output
  token i are entries `[i*K, (i+1)*K)`, most likely first. K is the run's
  (`RunSpec.logprobs`), also `len(top_logprobs) // output_len`.
`unflatten` reads them back as (output_len, K) arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MAX_LOGPROBS = 20
INT32_LIMIT = 2**31
NEG_INF = float("-inf")


class BadLogprobs(ValueError):
    """An answer's log-probabilities that do not fit its output ids (the message says where)."""


@dataclass(frozen=True)
class Logprobs:
    """A generation's log-probabilities as the shard stores them (module docstring)."""
    chosen: list[float]      # one per output token
    top_ids: list[int]       # K per output token, flattened
    top: list[float]         # K per output token, flattened


def request_fields(k: int | None) -> dict:
    """The top-level `/generate` fields that ask for the top-`k` log-probabilities (none for no `k`)."""
    if not k:
        return {}
    return {"return_logprob": True, "top_logprobs_num": k, "logprob_start_len": -1}


def from_meta(meta: dict, output_ids: list[int], k: int) -> Logprobs:
    """The log-probabilities of an answer asked for with `request_fields(k)`; `BadLogprobs` where they
    are missing or do not fit `output_ids` token for token."""
    chosen_entries, top_entries = meta.get("output_token_logprobs"), meta.get("output_top_logprobs")
    n = len(output_ids)
    if not isinstance(chosen_entries, list) or not isinstance(top_entries, list):
        raise BadLogprobs("asked for log-probabilities, the answer has no output_token_logprobs and "
                          "output_top_logprobs lists")
    if n == 0:  # SGLang answers a budget of 0 (never sent) with one top list for no token
        return Logprobs([], [], [])
    if len(chosen_entries) != n or len(top_entries) != n:
        raise BadLogprobs(f"{len(chosen_entries)} output_token_logprobs and {len(top_entries)} "
                          f"output_top_logprobs for {n} output ids")
    chosen = []
    for i, (entry, token) in enumerate(zip(chosen_entries, output_ids)):
        value, token_id = _entry(entry, f"output_token_logprobs[{i}]")
        if token_id != token:
            raise BadLogprobs(f"output_token_logprobs[{i}] names token {token_id}, output_ids[{i}] is {token}")
        chosen.append(value)
    top_ids, top = [], []
    for i, position in enumerate(top_entries):
        if not isinstance(position, list) or len(position) != k:
            got = len(position) if isinstance(position, list) else type(position).__name__
            raise BadLogprobs(f"output_top_logprobs[{i}] has {got} entries, not {k}")
        for j, entry in enumerate(position):
            value, token_id = _entry(entry, f"output_top_logprobs[{i}][{j}]")
            top.append(value)
            top_ids.append(token_id)
    return Logprobs(chosen, top_ids, top)


def _entry(entry: object, where: str) -> tuple[float, int]:
    """(logprob, token id) of a `[logprob, token_id, text]` entry; null (not finite on the wire) is -inf."""
    if not isinstance(entry, list) or len(entry) < 2:
        raise BadLogprobs(f"{where} is not a [logprob, token_id, text] entry")
    value, token_id = entry[0], entry[1]
    if type(token_id) is not int or not 0 <= token_id < INT32_LIMIT:
        raise BadLogprobs(f"{where} token id {str(token_id)[:40]} is not a token id")
    if value is None:
        return NEG_INF, token_id
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise BadLogprobs(f"{where} logprob {str(value)[:40]} is not a number")
    return float(value), token_id


def unflatten(row: dict, k: int | None = None):
    """A shard row's log-probabilities as numpy arrays: (chosen `(n,)`, top ids `(n, K)`, top `(n, K)`),
    n its output length; K from the row where not given. None for a row stored without them."""
    import numpy as np

    if row.get("logprobs") is None:
        return None
    chosen = np.asarray(row["logprobs"], dtype=np.float32)
    n = len(chosen)
    k = k or (len(row["top_logprobs"]) // n if n else 0)
    ids = np.asarray(row["top_logprob_ids"], dtype=np.int32).reshape(n, k)
    top = np.asarray(row["top_logprobs"], dtype=np.float32).reshape(n, k)
    return chosen, ids, top
