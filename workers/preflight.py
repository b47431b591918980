"""What a server must show before it gets its first prompt.

`/model_info` names the checkpoint (so a node launched with the wrong one gets
no prompt of a run that names another), `/server_info` tells whether the server
would truncate prompts on its own (refused: it would corrupt samples silently),
and `/v1/models` gives the context length used to dead-letter prompts that
cannot fit before sending them. A reasoning parser is only noted: SGLang's
native `/generate` returns raw `output_ids` with or without one.
"""
from __future__ import annotations

import httpx

from .servers import ServerBinding


def _get_json(client: httpx.Client, url: str, *paths: str) -> dict | None:
    """The first of `paths` that answers 200 (newer name first, then the deprecated alias)."""
    for path in paths:
        response = client.get(f"{url}{path}")
        if response.status_code == 200:
            return response.json()
    return None


def preflight(client: httpx.Client, binding: ServerBinding) -> None:
    url = binding.url
    model_info = _get_json(client, url, "/model_info", "/get_model_info") or {}
    server_info = _get_json(client, url, "/server_info", "/get_server_info") or {}
    models = _get_json(client, url, "/v1/models") or {}

    binding.model_path = model_info.get("model_path") or server_info.get("model_path")
    binding.served_model_name = server_info.get("served_model_name") or model_info.get("served_model_name")
    binding.reasoning_parser = server_info.get("reasoning_parser") or model_info.get("reasoning_parser")
    cards = models.get("data") or []
    binding.max_model_len = cards[0].get("max_model_len") if cards else server_info.get("context_length")
    binding.refusal = None
    if server_info.get("allow_auto_truncate"):
        binding.refusal = ("allow_auto_truncate is on, so it would cut long prompts without saying so; "
                           "relaunch SGLang without --allow-auto-truncate")
    elif model_info.get("is_generation") is False:
        binding.refusal = "it serves an embedding model (is_generation is false); point SGLANG_URLS at a generation server"
