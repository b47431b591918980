"""How a finished non-streaming `/generate` answer leaves the server.

Why a module of its own: the answer's bytes are where the delivery faults
act. `bad_output` damages each hit result (or, for `not_json`, cuts the
encoded body short while it keeps saying application/json) and `trickle`
sends the body slowly. Everything else is a plain JSON 200. The stats record
every damaged or trickled answer under the prompt's key, so a test can read
which prompt got what from `/standin/stats`.
"""

from __future__ import annotations

import json

from starlette.responses import Response

from sglang_standin.bad_outputs import corrupt_result
from sglang_standin.config import StandinConfig
from sglang_standin.responses import Planned
from sglang_standin.stats import Stats
from sglang_standin.trickle import trickle_response


def encode(payload: object) -> bytes:
    """JSON as Starlette's JSONResponse writes it (compact, UTF-8)."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


def deliver(plans: list[Planned], bodies: list[dict], is_single: bool, cfg: StandinConfig,
            stats: Stats) -> Response:
    """The HTTP answer for finished results, with any delivery fault applied."""
    for plan, body in zip(plans, bodies):
        if plan.bad_kind is not None:
            corrupt_result(body, plan.bad_kind, cfg)
            stats.note_bad_output(plan.key, plan.bad_kind)
    content = encode(bodies[0] if is_single else bodies)
    if any(p.bad_kind == "not_json" for p in plans):
        content = content[: len(content) // 2]  # a cut-off object is never valid JSON
    trickled = [p for p in plans if p.fault == "trickle"]
    if trickled:
        for plan in trickled:
            stats.note_trickle(plan.key)
        return trickle_response(content, cfg.trickle_seconds)
    return Response(content, media_type="application/json")
