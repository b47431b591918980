"""A line's own `sampling`: checked at enqueue, merged over the run's by the worker.

A prompt line may carry `"sampling": {...}` with any of six keys, which then
apply to that line alone, over the run's (`enqueue --temperature ...`):

| key | SGLang's check (`SamplingParams.verify`, 0.5.23) | sent as |
|---|---|---|
| `temperature` | a finite number >= 0 (below 1e-6: greedy) | `temperature` |
| `top_p` | a number in (0, 1] | `top_p` |
| `top_k` | an integer, -1 (the whole vocabulary) or >= 1 (at most 2^31 - 1, an int32 column) | `top_k` |
| `min_p` | a number in [0, 1] | `min_p` |
| `max_new_tokens` | an integer >= 1 (SGLang takes 0; an empty answer is no sample) | `max_new_tokens` |
| `seed` | an integer in [0, 2^31) | `sampling_seed` (`contract.run.samples.sample_seed`) |

**Why checked here, and as SGLang checks them.** A value SGLang refuses would
come back as a 400 from every server, and the prompt would be dead-lettered
as `server_rejected` after its whole trip through the queue; an unknown key
inside `sampling_params` is refused by 0.5.23's contract gate the same way
(`{"error": "unknown field ..."}`), and a float where it wants an integer
(`max_new_tokens: 3.0`) too. So the producer refuses such a line at enqueue,
with its line number, and publishes the others: a typo costs one line, found
at once. A boolean is never a number here (JSON `true` is not 1 to serde).

**Why `seed` is not sent as it is.** SGLang's key is `sampling_seed`, and a
run of several samples a prompt needs a different seed per sample: the worker
sends `sample_seed(run, line id, index, seed)`, which is the line's seed itself
for sample 0. SGLang honours it only on a server started with
`--enable-deterministic-inference`; elsewhere it is accepted and has no effect.
"""
from __future__ import annotations

import math

from contract.run.samples import SEED_MODULUS

KEYS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens", "seed")
INT32_MAX = 2**31 - 1


class BadSampling(ValueError):
    """A line's `sampling` that SGLang would refuse (the message says which key and why)."""


def check_line_sampling(value: object) -> dict | None:
    """The line's `sampling` object as sent on (None where it gave none or an empty one);
    raises `BadSampling` naming the first key that SGLang (or the fleet) would refuse."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadSampling(f'"sampling" must be an object, not {json_kind(value)}')
    unknown = sorted(k for k in value if k not in KEYS)
    if unknown:
        raise BadSampling(f'"sampling" has unknown key {unknown[0][:50]!r} (allowed: {", ".join(KEYS)})')
    for key in KEYS:
        if key in value:
            _check(key, value[key])
    return dict(value) or None


def _check(key: str, v: object) -> None:
    where = f"sampling.{key}"
    if key in ("top_k", "max_new_tokens", "seed"):
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadSampling(f"{where} must be an integer, not {json_kind(v)}")
        if key == "top_k" and not (v == -1 or 1 <= v <= INT32_MAX):
            raise BadSampling(f"{where} must be -1 (the whole vocabulary) or at least 1, got {v}")
        if key == "max_new_tokens" and not 1 <= v <= INT32_MAX:
            raise BadSampling(f"{where} must be at least 1 (and at most {INT32_MAX}), got {v}")
        if key == "seed" and not 0 <= v < SEED_MODULUS:
            raise BadSampling(f"{where} must be in [0, 2^31), got {v}")
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadSampling(f"{where} must be a number, not {json_kind(v)}")
    if key == "temperature" and not (math.isfinite(v) and v >= 0):
        raise BadSampling(f"{where} must be a non-negative finite number, got {v}")
    if key == "top_p" and not 0 < v <= 1:
        raise BadSampling(f"{where} must be in (0, 1], got {v}")
    if key == "min_p" and not 0 <= v <= 1:
        raise BadSampling(f"{where} must be in [0, 1], got {v}")


def merged(run_sampling: dict, line_sampling: dict | None) -> dict:
    """The `sampling_params` of a request: the run's, each key the line gives replaced by the
    line's; the line's `seed` is not a sampling parameter of SGLang's and is left out (the caller
    sends it as `sampling_seed`)."""
    if not line_sampling:
        return dict(run_sampling)
    return {**run_sampling, **{k: v for k, v in line_sampling.items() if k != "seed"}}


def line_seed(line_sampling: dict | None) -> int | None:
    """The seed the line asked for, if any."""
    return (line_sampling or {}).get("seed")


def json_kind(value: object) -> str:
    """A JSON value's type as a person reading the file would name it (the producer's line errors
    and the sampling object's say it the same way)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({str(value)[:20]})"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "an empty array" if not value else "an array"
    return "an object"
