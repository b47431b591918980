"""A server's info routes: read (`fetch_info`), and one server judged from its answers (`apply_info`, pure).

`/model_info`, `/server_info` and `/v1/models` (each by its newer name, then the
deprecated alias) fill a binding: its checkpoint, versions, context length and
refusal, if it is refused. The same rules judge a server bound directly
(`workers/servers/preflight.py`) and each server a gateway lists
(`workers/servers/gateway_preflight.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

import httpx

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
    model_info, server_info, models = (body_of(info, name) for name in INFO_ROUTES)
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


def body_of(info: dict[str, Info], name: str) -> dict:
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
