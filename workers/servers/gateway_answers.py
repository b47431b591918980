"""Which failed answers are SGLang's gateway speaking for itself, not a server judging the prompt.

The gateway (sgl-model-gateway / sglang-router, `src/routers/error.rs`) writes
its own errors as `{"error": {"message", "type", "code"}}` with a string
`code`; SGLang's servers write `{"error": {"message"}}` (or an integer `code`).
Two kinds matter to the fleet:
- `OUTAGE`: no worker took the request at all: `503 no_available_workers`
  ("all circuits open or unhealthy"), `no_workers`. The gateway is down for
  this binding's purposes, whatever its `/readiness` says; the prompt was not
  tried, so it spends no attempt.
- `UPSTREAM`: the gateway tried a worker and lost it (`call_upstream_*`: the
  connection failed or was cut, it timed out; the body could not be read; no
  worker answered), after its own retries. The analogue of a server
  connection that failed: not the prompt's fault, yet bounded per prompt
  (a prompt that crashes every worker must end).
Pure: status and body in, a kind or None out.
"""
from __future__ import annotations

import json

OUTAGE, UPSTREAM = "outage", "upstream"
OUTAGE_CODES = frozenset({"no_available_workers", "no_workers", "no_healthy_workers", "no_healthy_worker_pair"})
UPSTREAM_CODES = frozenset({"read_response_failed", "read_response_body_failed", "no_worker_response",
                            "proxy_request_failed"})
OUTAGE_MESSAGES = ("no available workers", "no workers are available")  # routers without a code


def gateway_failure(status: int, body: bytes) -> str | None:
    """`OUTAGE`, `UPSTREAM`, or None when the answer is not the gateway's own failure."""
    if status < 500:
        return None
    code, message = _code_and_message(body)
    if code in OUTAGE_CODES or (code is None and message.lower().startswith(OUTAGE_MESSAGES)):
        return OUTAGE
    if code is not None and (code in UPSTREAM_CODES or code.startswith("call_upstream_")):
        return UPSTREAM
    return None


def _code_and_message(body: bytes) -> tuple[str | None, str]:
    try:
        data = json.loads(body)
    except ValueError:
        return None, body[:200].decode("utf-8", "replace").strip()
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None, str(error or "")
    code = error.get("code")
    return (code if isinstance(code, str) else None), str(error.get("message", ""))
