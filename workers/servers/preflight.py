"""What a server must show before it gets its first prompt.

`/model_info` names the checkpoint (so a node launched with the wrong one gets
no prompt of a run that names another), `/server_info` tells whether the server
would truncate prompts on its own (refused: it would corrupt samples silently),
and `/v1/models` gives the context length used to dead-letter prompts that
cannot fit before sending them. A reasoning parser is only noted: SGLang's
native `/generate` returns raw `output_ids` with or without one.

A server started with `--api-key` answers `/health` to anyone but these routes
only with the key: a 401/403 on any of them refuses the server with a reason
that names `SGLANG_API_KEY` (never its value), so the gate consumes nothing
for it instead of sending prompts that would loop through retries. Reading
those routes and judging one server's answers, the same rules for a server
bound directly and for each server a gateway lists, are
`workers/servers/server_info.py`.

The preflight also reads the server's capacity (`workers/servers/capacity.py`), which
the health monitor turns into the binding's fresh in-flight target, and
whether the URL is SGLang's model gateway (`workers/servers/load.py`): then
every judgement comes from the servers the gateway lists, each read directly
(`workers/servers/gateway_preflight.py`), since the gateway answers none of these
routes for its workers.

Never an unknown context length: the length used is the smallest that any
source gives (the servers' own, `FLEET_CONTEXT_LENGTH`); a server or gateway
whose length cannot be read, without that setting, gets no prompt
(`Unreadable`, judged again each health round) and one log line that says
what could not be read and how to fix it.
"""
from __future__ import annotations

import httpx

from .bindings import ServerBinding
from .capacity import capacity_from_server_info
from .gateway_preflight import judge_gateway
from .load import gateway_workers, loads_capacity
from .server_info import apply_info, body_of, fetch_info


class Unreadable(Exception):
    """What the binding's context length depends on could not be read (the message says how to fix it)."""


def preflight(client: httpx.Client, binding: ServerBinding) -> int | None:
    """Judge the server from its info routes; returns its capacity (None: it does not say)."""
    key_sent = "authorization" in client.headers
    binding.gateway_workers = gateway_workers(client, binding.url)
    if binding.gateway_workers is not None:
        return judge_gateway(client, binding, key_sent)
    info = fetch_info(client, binding.url)
    apply_info(binding, info, key_sent)
    binding.unread = None if binding.max_model_len else (
        f"no context length from {binding.url} (neither /v1/models max_model_len nor /server_info context_length)")
    return capacity_from_server_info(body_of(info, "server_info")) or loads_capacity(client, binding.url)


def settle_context(binding: ServerBinding, setting: int) -> None:
    """The context length used: the smallest known (the servers', `FLEET_CONTEXT_LENGTH`); raises
    `Unreadable` when a server's could not be read and the setting does not give it."""
    if binding.refusal:
        return
    if (binding.unread or not binding.max_model_len) and not setting:
        unread = binding.unread or f"the context length of {binding.url}"
        raise Unreadable(f"could not read {unread}: make the servers reachable from this worker, or "
                         "set FLEET_CONTEXT_LENGTH to their context length (SGLang's --context-length)")
    binding.max_model_len = min(n for n in (binding.max_model_len, setting) if n)
