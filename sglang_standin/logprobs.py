"""Log-probabilities in `meta_info`, where a request asks with `return_logprob`, as SGLang 0.5.23 answers.

Measured on the real server (tests/real/test_standin_contract.py keeps it so):
- the top-level fields `return_logprob` (bool), `top_logprobs_num` (int, 0 or
  less: no top lists) and `logprob_start_len` (int, -1: output tokens only)
  are type-checked by the contract gate (`contract_gate`), a bool or an int or
  a list of them, one per prompt of a batch;
- with `return_logprob`, `meta_info` gains, right after `num_retractions`:
  `input_token_logprobs`, `output_token_logprobs` (one `[logprob, token_id,
  null]` per token, the id that of `output_ids` there),
  `output_token_logprobs_length`, and with `top_logprobs_num` K > 0
  `input_top_logprobs` and `output_top_logprobs` (per token a list of K such
  entries, most likely first);
- `logprob_start_len` -1 leaves the input lists empty; from a position s >= 0
  they cover the prompt's tokens from s on, the first prompt token's logprob
  null (nothing predicts it) and its top list null;
- a budget of 0 answers no output token and yet one top list (the distribution
  after the prompt): `output_top_logprobs` then has one entry, the other lists
  none.
Without `return_logprob` none of these keys is there, whatever else is asked.

The stand-in runs no model, so the values are made up, deterministically from
the token and its position: the token produced is the most likely of its top
list (as a greedy model's), its candidates follow with lower log-probabilities.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class LogprobAsk:
    """What one prompt of a request asked for."""

    top: int          # top_logprobs_num, 0 for none
    start: int        # logprob_start_len, -1: output only


def ask_of(body: dict, index: int) -> LogprobAsk | None:
    """The ask of prompt `index` of a request (the contract gate has checked the types), or None."""
    def pick(key: str, default):
        value = body.get(key)
        if isinstance(value, list):
            value = value[index] if index < len(value) else None
        return default if value is None else value

    if not pick("return_logprob", False):
        return None
    return LogprobAsk(top=max(0, int(pick("top_logprobs_num", 0))), start=int(pick("logprob_start_len", -1)))


def _draws(token: int, position: int, count: int) -> tuple[int, ...]:
    """`count` uniform 32-bit numbers of a position's own (shake-256 of the token and position: the
    same on any machine), one hash a position."""
    return struct.unpack(f"<{count}I", hashlib.shake_256(f"{token}/{position}".encode()).digest(4 * count))


def _values(draws: tuple[int, ...], k: int) -> list[float]:
    """The log-probabilities of a position's k most likely candidates: each below the one before it by
    a drawn gap, every value's digits its own (as a model's are: shard sizes measured on the stand-in hold)."""
    values = [-0.02 - 0.5 * draws[0] / 2**32]
    for rank in range(1, k):
        values.append(values[-1] - 0.05 - 2.5 * draws[rank] / 2**32)
    return values


def _chosen(token: int, position: int) -> float:
    """The produced token's log-probability: the first of its position's top list."""
    return _values(_draws(token, position, 1), 1)[0]


def _candidates(token: int, position: int, k: int, vocab: int) -> list[list]:
    """K entries, `token` first, the others distinct ids drawn from (token, position)."""
    draws = _draws(token, position, 3 * k)  # k values, then ids enough for a few repeats
    values, entries, seen = _values(draws, k), [], {token}
    entries.append([values[0], token, None])
    for draw in draws[k:]:
        if len(entries) == k:
            break
        if draw % vocab not in seen:
            seen.add(draw % vocab)
            entries.append([values[len(entries)], draw % vocab, None])
    extra = len(entries)
    while len(entries) < k:  # a vocabulary barely larger than K: the next free ids
        extra = (extra + 1) % vocab
        if extra not in seen:
            seen.add(extra)
            entries.append([values[len(entries)], extra, None])
    return entries


def logprob_meta(ask: LogprobAsk, prompt: list[int], output: list[int], vocab: int) -> dict:
    """The `meta_info` keys for `ask`, in SGLang's order."""
    inputs = [] if ask.start < 0 else list(range(ask.start, len(prompt)))
    meta: dict = {
        "input_token_logprobs": [[None if p == 0 else _chosen(prompt[p], p), prompt[p], None] for p in inputs],
        "output_token_logprobs": [[_chosen(t, len(prompt) + i), t, None] for i, t in enumerate(output)],
        "output_token_logprobs_length": len(output),
    }
    if ask.top > 0:
        meta["input_top_logprobs"] = [None if p == 0 else _candidates(prompt[p], p, ask.top, vocab) for p in inputs]
        after = [_candidates(t, len(prompt) + i, ask.top, vocab) for i, t in enumerate(output)]
        if not output:  # no token, and yet the distribution after the prompt (a budget of 0)
            after = [_candidates(prompt[-1], len(prompt), ask.top, vocab)]
        meta["output_top_logprobs"] = after
    return meta
