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
for it instead of sending prompts that would loop through retries. The HTTP
(`fetch_info`) is apart from the judgement (`apply_info`), which is pure.

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

from dataclasses import dataclass

import httpx

from .capacity import capacity_from_server_info
from .load import gateway_workers, loads_capacity
from .bindings import ServerBinding

# Each info document, by the routes that serve it (newer name first, then the deprecated alias).
INFO_ROUTES = {
    "model_info": ("/model_info", "/get_model_info"),
    "server_info": ("/server_info", "/get_server_info"),
    "models": ("/v1/models",),
}
CREDENTIALS = (401, 403)


@dataclass(frozen=True)
class Info:
    route: str
    status: int
    body: dict | None  # the JSON object of a 200, else None


class Unreadable(Exception):
    """What the binding's context length depends on could not be read (the message says how to fix it)."""


def preflight(client: httpx.Client, binding: ServerBinding) -> int | None:
    """Judge the server from its info routes; returns its capacity (None: it does not say)."""
    key_sent = "authorization" in client.headers
    binding.gateway_workers = gateway_workers(client, binding.url)
    if binding.gateway_workers is not None:
        from .gateway_preflight import judge_gateway  # judges each server by this module's rules
        return judge_gateway(client, binding, key_sent)
    info = fetch_info(client, binding.url)
    apply_info(binding, info, key_sent)
    binding.unread = None if binding.max_model_len else (
        f"no context length from {binding.url} (neither /v1/models max_model_len nor /server_info context_length)")
    return capacity_from_server_info(_body(info, "server_info")) or loads_capacity(client, binding.url)


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


def fetch_info(client: httpx.Client, url: str) -> dict[str, Info]:
    """Each info document from the first of its routes that answers 200 (or refuses the credentials)."""
    found: dict[str, Info] = {}
    for name, routes in INFO_ROUTES.items():
        for route in routes:
            response = client.get(f"{url}{route}")
            found[name] = Info(route, response.status_code, _object(response))
            if response.status_code == 200 or response.status_code in CREDENTIALS:
                break
    return found


def _object(response: httpx.Response) -> dict | None:
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def apply_info(binding: ServerBinding, info: dict[str, Info], key_sent: bool) -> None:
    """Fill the binding from the server's answers, and say why it is refused, if it is."""
    denied = next((i for i in info.values() if i.status in CREDENTIALS), None)
    if denied is not None:
        binding.refusal = credentials_refusal(denied.status, denied.route, key_sent)
        return
    model_info, server_info, models = (_body(info, name) for name in INFO_ROUTES)
    binding.model_path = model_info.get("model_path") or server_info.get("model_path")
    binding.served_model_name = server_info.get("served_model_name") or model_info.get("served_model_name")
    binding.reasoning_parser = server_info.get("reasoning_parser") or model_info.get("reasoning_parser")
    binding.sglang_version = _text(server_info.get("version"))
    binding.weight_version = _text(model_info.get("weight_version")) or _text(server_info.get("weight_version"))
    cards = models.get("data") or []
    binding.max_model_len = _positive(cards[0].get("max_model_len") if cards else None) or \
        _positive(server_info.get("context_length"))
    binding.max_input_len = _positive(server_info.get("max_req_input_len"))
    binding.vocab_size = _vocab_size(model_info, server_info)
    binding.dp_size = server_info.get("dp_size") if isinstance(server_info.get("dp_size"), int) else 1
    binding.refusal = None
    if server_info.get("allow_auto_truncate"):
        binding.refusal = ("allow_auto_truncate is on, so it would cut long prompts without saying so; "
                           "relaunch SGLang without --allow-auto-truncate")
    elif model_info.get("is_generation") is False:
        binding.refusal = "it serves an embedding model (is_generation is false); point SGLANG_URLS at a generation server"


def _body(info: dict[str, Info], name: str) -> dict:
    found = info.get(name)
    return (found.body if found else None) or {}


def credentials_refusal(status: int, route: str, key_sent: bool) -> str:
    """Why a server that refuses this worker's credentials is refused: names the setting, never its value."""
    if key_sent:
        fix = "SGLANG_API_KEY is set but the server does not accept it; set it to the server's --api-key"
    else:
        fix = "SGLANG_API_KEY is unset; set it to the server's --api-key"
    return f"HTTP {status} on {route}: the server refuses this worker's credentials ({fix}, then restart the worker)"


def _text(value) -> str | None:
    """A version as text (None where the server gave none)."""
    return str(value)[:200] if isinstance(value, (str, int, float)) and value != "" else None


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _vocab_size(*documents: dict) -> int | None:
    """The vocabulary size, where a server reports one (SGLang's info routes do not today)."""
    for document in documents:
        value = document.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
