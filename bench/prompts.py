"""Prompt files for the bench, built from the bundled examples.

The ~300 bundled example conversations are repeated to any count, each copy
with its own id, so that every figure runs on real chat-template input and
the fleet never skips a prompt as a duplicate. The stand-in derives each
answer from the prompt's token ids, so repeated conversations get repeated
output lengths: both sides of a comparison see exactly the same work.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from producer.prompts import Prompt, read_prompts

EXAMPLES = Path(__file__).resolve().parents[1] / "producer" / "examples" / "prompts.jsonl"


@lru_cache(maxsize=1)
def example_conversations() -> tuple[tuple[dict, ...], ...]:
    """The bundled conversations, parsed by the producer's own reader."""
    return tuple(tuple(p.messages) for p in read_prompts(EXAMPLES) if isinstance(p, Prompt))


def repeated(n: int) -> list[tuple[str, list[dict]]]:
    """n (id, messages) pairs cycling through the examples."""
    convs = example_conversations()
    return [(f"b{i:07d}", list(convs[i % len(convs)])) for i in range(n)]


def long_prompts(n: int, target_tokens: int, count_tokens) -> list[tuple[str, list[dict]]]:
    """n single-turn prompts of about `target_tokens` tokens each.

    Each one joins the user turns of consecutive examples, starting at a
    different example, until its text reaches the target; `count_tokens`
    (text -> tokens) sizes the pieces once.
    """
    texts = [next(m["content"] for m in conv if m["role"] == "user") for conv in example_conversations()]
    sizes = [count_tokens(t) for t in texts]
    out = []
    for i in range(n):
        parts, total, j = [], 4, i  # the template adds a few tokens
        while total < target_tokens:
            k = j % len(texts)
            if parts and total + sizes[k] + 1 - target_tokens > target_tokens - total:
                break  # stopping short is closer to the target than adding this piece
            parts.append(texts[k])
            total += sizes[k] + 1
            j += 1
        out.append((f"L{i:07d}", [{"role": "user", "content": "\n".join(parts)}]))
    return out


def write_jsonl(path: Path, prompts: list[tuple[str, list[dict]]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for prompt_id, messages in prompts:
            handle.write(json.dumps({"id": prompt_id, "messages": messages}, ensure_ascii=False) + "\n")
    return path
