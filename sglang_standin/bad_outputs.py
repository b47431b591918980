"""The bad-output fault: a 200 answer that a correct client must refuse.

Why: a real server (or a proxy, or a bit flip) can hand back HTTP 200 with
`output_ids` that are not token ids at all. A client that only checks the
status code would store garbage as a finished generation. Each kind here is
one way the body can be wrong while everything else about it looks normal.

Which prompts are hit is `outputs.fault_for(ids, cfg) == "bad_output"`; the
kind is drawn by `bad_output_kind` from a second hash of the same ids, so a
test can predict both. The tokens themselves are still `generate_output`'s:
the damage is done to the finished result dict (`corrupt_result`) or, for
`not_json`, to the encoded bytes (see `delivery`).
"""

from __future__ import annotations

from typing import Sequence

from sglang_standin.config import StandinConfig
from sglang_standin.outputs import fault_for, prompt_rng

#: Kinds that put one wrong entry in the middle of output_ids.
ENTRY_KINDS: frozenset[str] = frozenset(
    {"negative", "null", "bool", "float", "string", "huge_id", "beyond_vocab"})
#: The huge_id value: one past the int32 range.
HUGE_ID = 2**31
#: Distinct content ids the huge_body output cycles through.
_HUGE_BODY_POOL = 1000


def bad_output_kind(prompt_ids: Sequence[int], cfg: StandinConfig) -> str | None:
    """The bad-output kind this prompt gets, or None if it is not hit.

    Kind = enabled[int(r * len(enabled))], r the first `random()` of the
    prompt's "bad-output-kind" stream, enabled = `cfg.enabled_bad_output_kinds`
    (BAD_OUTPUT_KINDS order, whatever order the CLI listed them in).
    """
    if fault_for(prompt_ids, cfg) != "bad_output":
        return None
    kinds = cfg.enabled_bad_output_kinds
    r = prompt_rng(prompt_ids, cfg, b"bad-output-kind").random()
    return kinds[min(int(r * len(kinds)), len(kinds) - 1)]


def corrupt_result(result: dict, kind: str, cfg: StandinConfig) -> dict:
    """Damage one `{"text", "output_ids", "meta_info"}` dict in place, and return it.

    `completion_tokens` keeps matching `len(output_ids)` (except for
    meta_types, whose point is its type), so each kind is the only defect.
    `not_json` leaves the dict alone: it is applied to the encoded body.
    """
    ids: list = result["output_ids"]
    meta: dict = result["meta_info"]
    if kind in ENTRY_KINDS:
        pos = len(ids) // 2
        original = ids[pos] if ids else cfg.vocab_low
        value = bad_entry(kind, original, cfg)
        if ids:
            ids[pos] = value
        else:
            ids.append(value)
        meta["completion_tokens"] = len(ids)
    elif kind == "meta_types":
        meta["completion_tokens"] = str(meta.get("completion_tokens", len(ids)))
        meta["finish_reason"] = [meta.get("finish_reason")]
    elif kind == "huge_body":
        result["output_ids"] = huge_ids(cfg)
        meta["completion_tokens"] = cfg.huge_body_ids
    return result


def bad_entry(kind: str, original: int, cfg: StandinConfig) -> object:
    """The JSON value that replaces one output id for an ENTRY_KINDS kind."""
    values: dict[str, object] = {
        "negative": -1,
        "null": None,
        "bool": True,
        "float": 1.5,
        "string": str(original),  # "12345": int() would accept it, a strict client must not
        "huge_id": HUGE_ID,
        "beyond_vocab": cfg.vocab_size,  # the first id outside the vocabulary
    }
    return values[kind]


def huge_ids(cfg: StandinConfig) -> list[int]:
    """`cfg.huge_body_ids` valid-looking content ids: only the size is wrong."""
    special = cfg.special_ids
    top = min(cfg.vocab_high, cfg.vocab_low + _HUGE_BODY_POOL)
    pool = [i for i in range(cfg.vocab_low, top) if i not in special]
    n = cfg.huge_body_ids
    return (pool * (n // len(pool) + 1))[:n]
