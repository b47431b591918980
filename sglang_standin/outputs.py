"""Deterministic model outputs: the same prompt always gets the same tokens.

Pure functions only (no I/O, no clock, no global state), so tests import them
to compute, for any prompt, the exact `output_ids` and `finish_reason` the
stand-in will answer. Randomness is seeded from sha256 of the prompt ids
(int32 little-endian) and `cfg.seed`; Python's `hash()` is never used, so
results are stable across processes and runs.

Shape of a natural output (think-start sits at the end of the prompt):

    R reasoning ids, think_end, A answer ids, eos

with `--emit-think-start` it starts with think_start. Faults (see
`fault_for`) alter this shape for a deterministic share of prompts.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Iterable, Sequence

import numpy as np

from sglang_standin.config import FAULT_NAMES, StandinConfig

#: How many trailing prompt ids the echo-prompt fault copies into the output.
ECHO_PROMPT_TOKENS = 8
#: Finish reason of a running request that was aborted (as SGLang reports it).
ABORT_FINISH: dict = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
_REASONING_SHARE = 0.7


def prompt_bytes(prompt_ids: Sequence[int]) -> bytes:
    """The prompt as int32 little-endian bytes (ids wrap modulo 2**32)."""
    arr = np.asarray(prompt_ids, dtype=np.int64) & 0xFFFFFFFF
    return arr.astype("<u4").tobytes()


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """sha256 hex of the prompt ids: the per-prompt key when no rid is given."""
    return hashlib.sha256(prompt_bytes(prompt_ids)).hexdigest()


def prompt_rng(prompt_ids: Sequence[int], cfg: StandinConfig, purpose: bytes) -> random.Random:
    """An independent random stream per (prompt, seed, purpose)."""
    h = hashlib.sha256()
    h.update(b"sglang-standin/" + purpose + b"/")
    h.update(int(cfg.seed).to_bytes(16, "little", signed=True))
    h.update(prompt_bytes(prompt_ids))
    return random.Random(int.from_bytes(h.digest(), "big"))


def for_seed(cfg: StandinConfig, sampling_seed: int | None) -> StandinConfig:
    """The config one request's answer is drawn with: with `--seeded-outputs` and a
    `sampling_seed`, the seed mixed into `cfg.seed` (so each sample of a prompt gets its own
    length, tokens and faults, and the same seed the same answer); else `cfg` itself."""
    if not cfg.seeded_outputs or sampling_seed is None:
        return cfg
    import dataclasses

    return dataclasses.replace(cfg, seed=(cfg.seed * 1_000_003 + int(sampling_seed) + 1) % 2**127)


def fault_for(prompt_ids: Sequence[int], cfg: StandinConfig) -> str | None:
    """The fault this prompt gets (a FAULT_NAMES entry), or None.

    One uniform draw u per prompt, independent of the length draw; fault i
    owns [sum of earlier shares, + its share), so a prompt has at most one.
    "bad_output" and "trickle" (last in FAULT_NAMES, so adding them moved no
    other fault) leave the tokens alone: they act on delivery (`delivery`).
    """
    u = prompt_rng(prompt_ids, cfg, b"fault").random()
    edge = 0.0
    for name in FAULT_NAMES:
        share = cfg.fault_share(name)
        if share > 0 and edge <= u < edge + share:
            return name
        edge += share
    return None


def natural_length(prompt_ids: Sequence[int], cfg: StandinConfig) -> int:
    """Lognormal total length (median, sigma), clipped to [4, output_len_max].

    Box-Muller on two uniforms instead of `random.lognormvariate`, so the
    draw does not depend on the Python version's normal sampler.
    """
    rng = prompt_rng(prompt_ids, cfg, b"length")
    u1 = 1.0 - rng.random()  # (0, 1]: log is finite
    u2 = rng.random()
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    length = round(cfg.output_len_median * math.exp(cfg.output_len_sigma * z))
    return min(max(length, 4), cfg.output_len_max)


def _split(total: int) -> tuple[int, int]:
    """(reasoning, answer) sizes for a total length, each at least 1."""
    reasoning = max(1, min(round(_REASONING_SHARE * total), total - 3))
    return reasoning, max(1, total - reasoning - 2)


def _content_ids(rng: random.Random, n: int, cfg: StandinConfig) -> list[int]:
    """n ids uniform in [vocab_low, vocab_high), never a special id."""
    special = cfg.special_ids
    out: list[int] = []
    while len(out) < n:
        tok = rng.randrange(cfg.vocab_low, cfg.vocab_high)
        if tok not in special:
            out.append(tok)
    return out


def natural_output(prompt_ids: Sequence[int], cfg: StandinConfig) -> list[int]:
    """The whole sequence the "model" would write with an unlimited budget.

    Includes the shape faults (missing/double think-end, echoed prompt,
    empty reasoning/answer, lengthened-for-truncation). Always ends with eos.
    """
    fault = fault_for(prompt_ids, cfg)
    reasoning_n, answer_n = _split(natural_length(prompt_ids, cfg))
    if fault == "empty_reasoning":
        reasoning_n = 0
    if fault == "empty_answer":
        answer_n = 0
    lead = 1 if cfg.emit_think_start else 0
    if fault == "truncate":
        reasoning_n += max(0, cfg.fault_truncate_tokens - (lead + reasoning_n + answer_n + 2))
    rng = prompt_rng(prompt_ids, cfg, b"content")
    reasoning = _content_ids(rng, reasoning_n, cfg)
    answer = _content_ids(rng, answer_n, cfg)
    if fault == "double_think_end":
        middle = max(1, reasoning_n // 2)
        reasoning = reasoning[:middle] + [cfg.think_end_id] + reasoning[middle:]
    seq = [cfg.think_start_id] if cfg.emit_think_start else []
    seq += reasoning
    if fault != "missing_think_end":
        seq.append(cfg.think_end_id)
    seq += answer
    seq.append(cfg.eos_id)
    if fault == "echo_prompt":
        seq = list(prompt_ids[-ECHO_PROMPT_TOKENS:]) + seq
    return seq


def _continuation(prompt_ids: Sequence[int], cfg: StandinConfig, n: int) -> list[int]:
    """What the model writes past eos when told to ignore it (content ids)."""
    return _content_ids(prompt_rng(prompt_ids, cfg, b"past-eos"), n, cfg)


def generate_output(
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    cfg: StandinConfig,
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
) -> tuple[list[int], dict]:
    """The (output_ids, finish_reason) SGLang would return for one request.

    Mirrors SGLang's `Req.check_finished`: after each token, the length limit
    is checked FIRST, then stop ids (eos or `stop_token_ids`). So a stop id
    landing exactly on the last allowed position finishes with `length`, and
    a matched stop id is included in the output. `ignore_eos` ignores both
    eos and stop_token_ids, as SGLang does. The abort fault returns the first
    half of what would have been produced with an abort finish reason.
    """
    if max_new_tokens <= 0:
        out, finish = [], {"type": "length", "length": max(0, max_new_tokens)}
    else:
        out, finish = _run_until_finished(prompt_ids, max_new_tokens, cfg, stop_token_ids, ignore_eos)
    if fault_for(prompt_ids, cfg) == "abort":
        return out[: max(1, len(out) // 2)] if out else [], dict(ABORT_FINISH)
    return out, finish


def _run_until_finished(
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    cfg: StandinConfig,
    stop_token_ids: Iterable[int],
    ignore_eos: bool,
) -> tuple[list[int], dict]:
    seq = natural_output(prompt_ids, cfg)
    if ignore_eos and len(seq) < max_new_tokens:
        seq += _continuation(prompt_ids, cfg, max_new_tokens - len(seq))
    stops = set() if ignore_eos else {cfg.eos_id, *stop_token_ids}
    for n, tok in enumerate(seq, start=1):
        if n >= max_new_tokens:
            return seq[:n], {"type": "length", "length": max_new_tokens}
        if tok in stops:
            return seq[:n], {"type": "stop", "matched": tok}
    raise AssertionError("unreachable: natural outputs end with eos")
