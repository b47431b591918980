"""Redis bytes per queued prompt token: what a backlog costs the broker.

The queue is the work, and Redis runs with no eviction, so the memory a
queued prompt takes bounds how many prompts one Redis can hold. Prompts of
about 300 tokens are enqueued with no worker running; the figure is the
growth of INFO memory `used_memory` over the prompt tokens published. The
breakdown (MEMORY USAGE of the queue list and of the ledger's hashes, and the
anatomy of one queued message) says where the bytes go.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from .lab import Lab
from .prompts import long_prompts, write_jsonl
from .publish import enqueue, token_count


@dataclass
class RedisOptions:
    prompts: int = 5000
    prompt_tokens: int = 300
    max_new_tokens: int = 8192


def message_anatomy(element: bytes) -> dict:
    """Sizes of one queued kombu message: the element, its body, headers, arguments."""
    envelope = json.loads(element)
    body = envelope.get("body", "")
    encoding = envelope.get("properties", {}).get("body_encoding")
    decoded = base64.b64decode(body) if encoding == "base64" else body.encode()
    headers = envelope.get("headers", {})
    return {
        "element_bytes": len(element),
        "body_bytes": len(body),
        "body_encoding": encoding,
        "body_decoded_bytes": len(decoded),
        "task_args": json.loads(decoded)[0],
        "headers_bytes": len(json.dumps(headers)),
        "argsrepr_chars": len(headers.get("argsrepr") or ""),
        "rest_bytes": len(element) - len(body) - len(json.dumps(headers)),
    }


def run_redis_memory(lab: Lab, opts: RedisOptions, log) -> dict:
    from contract.keys import RunKeys
    from contract.settings import SharedSettings

    prompts = long_prompts(opts.prompts, opts.prompt_tokens, token_count)
    path = write_jsonl(lab.root / "prompts" / f"redis-{opts.prompts}x{opts.prompt_tokens}.jsonl", prompts)
    log(f"redis memory: {opts.prompts} prompts of ~{opts.prompt_tokens} tokens, no worker")
    lab.flush()
    client = lab.client
    before = int(client.info("memory")["used_memory"])
    summary = enqueue(path, "rm", opts.max_new_tokens)
    after = int(client.info("memory")["used_memory"])
    queue = SharedSettings().queue_prefix
    keys = RunKeys("rm")
    usage = {name: int(client.memory_usage(key, samples=0) or 0) for name, key in
             (("queue", queue), ("ledger_prompts", keys.token_ids))}
    usage["ledger_state"] = sum(int(client.memory_usage(key, samples=0) or 0)
                                for key in client.scan_iter(match=keys.state_prefix + "*", count=1000))
    first = client.lindex(queue, 0)
    result = {
        "prompts": summary.published,
        "prompt_tokens": summary.prompt_tokens,
        "mean_prompt_tokens": summary.prompt_tokens / summary.published,
        "used_memory_growth": after - before,
        "bytes_per_token": (after - before) / summary.prompt_tokens,
        "bytes_per_prompt": (after - before) / summary.published,
        "key_bytes_per_prompt": {name: b / summary.published for name, b in usage.items()},
        "other_bytes_per_prompt": (after - before - sum(usage.values())) / summary.published,
        "queue_length": int(client.llen(queue)),
        "message": message_anatomy(first) if first else None,
    }
    lab.flush()
    return result
