"""The preflight of a binding that is SGLang's model gateway: judged from the servers it lists.

The gateway answers none of the routes the preflight reads for its workers
(sglang-router 0.3.2: `/get_server_info` is its own `{"router_manager": true}`,
`/server_info` and `/model_info` are 404, `/v1/models` has no
`max_model_len`), so each server its `/workers` lists as healthy is read
directly, as for its load (`workers/servers/load.py`), and judged by the same
rules as a server bound directly (`workers/servers/server_info.py`):
- any server refused (it truncates prompts, serves embeddings, refuses the
  credentials) refuses the gateway, naming the server;
- servers that serve different models refuse it (the gateway would send a
  run's prompts to either);
- the context length is the smallest of the servers' (and the scheduler's
  longest input the smallest of theirs), so that prompt + budget fits
  whichever server the gateway picks;
- the capacity is the sum of theirs.
A server the worker cannot read leaves the context length unknown
(`binding.unread`): the gateway gets no prompt unless `FLEET_CONTEXT_LENGTH`
gives it (`preflight.settle_context`). The model is then taken from what the
servers read say, else the gateway's `/workers` metadata or forwarded
`/get_model_info`.
"""
from __future__ import annotations

import httpx

from .capacity import UNKNOWN_CAPACITY, capacity_from_server_info
from .load import loads_capacity
from .server_info import Info, apply_info, body_of, fetch_info
from .bindings import ServerBinding


def judge_gateway(client: httpx.Client, binding: ServerBinding, key_sent: bool) -> int | None:
    """Fill the gateway's binding from its servers; returns the sum of their capacities."""
    workers = binding.gateway_workers or []
    if not workers:
        raise httpx.HTTPError(f"gateway {binding.url} lists no healthy server yet")
    judged, unread, capacity = [], [], 0
    for url in sorted(workers):
        server, info = ServerBinding(url), _read(client, url)
        if info is None:
            unread.append(f"{url} (not reachable)")
            capacity += UNKNOWN_CAPACITY
            continue
        apply_info(server, info, key_sent)
        if server.refusal:
            _clear(binding)
            binding.refusal = f"its server {url}: {server.refusal}"
            return None
        if not server.max_model_len:
            unread.append(f"{url} (no context length in /v1/models or /server_info)")
        judged.append(server)
        capacity += capacity_from_server_info(body_of(info, "server_info")) or loads_capacity(client, url) \
            or UNKNOWN_CAPACITY
    _combine(client, binding, judged)
    binding.unread = f"the context length of the gateway's server(s) {', '.join(sorted(unread))}" if unread else None
    return capacity


def _read(client: httpx.Client, url: str) -> dict[str, Info] | None:
    """The server's info documents, or None when it cannot be reached from this worker."""
    try:
        return fetch_info(client, url)
    except httpx.HTTPError:
        return None


def _combine(client: httpx.Client, binding: ServerBinding, judged: list[ServerBinding]) -> None:
    _clear(binding)
    models = {(s.model_path, s.served_model_name) for s in judged}
    if len({path for path, _ in models}) > 1:
        binding.refusal = ("its servers serve different models (" + ", ".join(sorted(str(p) for p, _ in models))
                           + "): bind a gateway whose servers all serve one model")
        return
    first = judged[0] if judged else None
    if first is None:
        first = ServerBinding(binding.url)  # no server read: the model as the gateway reports it
        apply_info(first, fetch_info(client, binding.url), key_sent=False)
        first.refusal = None
    binding.model_path, binding.served_model_name = first.model_path, first.served_model_name
    binding.reasoning_parser = first.reasoning_parser
    # a gateway's SGLang versions and weight versions, its servers' (joined where they differ)
    binding.sglang_version = ",".join(sorted({s.sglang_version for s in judged if s.sglang_version})) or \
        first.sglang_version
    binding.weight_version = ",".join(sorted({s.weight_version for s in judged if s.weight_version})) or \
        first.weight_version
    binding.max_model_len = min((s.max_model_len for s in judged if s.max_model_len), default=None)
    binding.max_input_len = min((s.max_input_len for s in judged if s.max_input_len), default=None)
    binding.vocab_size = min((s.vocab_size for s in judged if s.vocab_size), default=None)
    binding.dp_size = 1


def _clear(binding: ServerBinding) -> None:
    binding.refusal = binding.model_path = binding.served_model_name = binding.reasoning_parser = None
    binding.max_model_len = binding.max_input_len = binding.vocab_size = None
