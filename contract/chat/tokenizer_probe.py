"""The tokenizer probe: how a worker knows a server's tokenizer is the run's before any prompt goes there.

A server fed an id its model does not have may die whole (SGLang 0.5.23 does
not range-check `input_ids`: the embedding's IndexError ends every process of
the server), and the prompt that did it is sent again after each restart. A
run enqueued with another model's tokenizer (the default `--tokenizer
bundled` in front of a Qwen server is enough) would do that to every server.

So `enqueue` records with the run a probe: a few texts and the ids the run's
tokenizer gives them: a rendered conversation (with the chat template, in
several scripts), and every added and special token of the tokenizer, which
hold its highest ids. A worker asks each server, before the run's first
prompt goes there, for its own ids of the same texts (SGLang's `POST
/tokenize`, `add_special_tokens` false, as the producer encodes), and a server
whose ids differ anywhere refuses the run. Same ids for every added token
means the server's tokenizer has every id the run's can make.

Pure: texts and ids in, a verdict out; the HTTP is the worker's
(`workers/servers/tokenizers.py`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

CONVERSATION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Hello! Grüße, 你好, здравствуйте, مرحبا 🙂 — 12 + 30 = ?"},
    {"role": "assistant", "content": "42."},
    {"role": "user", "content": "Thanks.\n\n  Tabs\tand    spaces."},
]
MAX_TEXTS = 4096  # added tokens probed at most (a vocabulary's added tokens are a few hundred, or thousands)


@dataclass(frozen=True)
class Probe:
    texts: list[str]
    ids: list[list[int]]
    digest: str = field(init=False, compare=False)  # names the probe: a worker keeps verdicts per server and probe

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hashlib.sha256(json.dumps([self.texts, self.ids]).encode()).hexdigest()[:16])

    def to_dict(self) -> dict:
        return {"texts": self.texts, "ids": self.ids}

    @classmethod
    def from_dict(cls, data: dict | None) -> "Probe | None":
        if not data:
            return None
        return cls(list(data["texts"]), [list(ids) for ids in data["ids"]])


def make_probe(tokenizer) -> Probe:
    """The probe of a transformers tokenizer with a chat template (the run's)."""
    rendered = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    tokens = sorted({t.content for t in tokenizer.added_tokens_decoder.values()} |
                    set(tokenizer.all_special_tokens))
    texts = [rendered, *tokens[:MAX_TEXTS]]
    return Probe(texts, [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts])


@dataclass(frozen=True)
class Difference:
    """Where a server's ids first differ from the run's."""
    text: str
    position: int
    ours: int | None   # the run's id there (None: the run's ids ended)
    theirs: int | None  # the server's

    def __str__(self) -> str:
        shown = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return (f"for the text {shown!r} the run's tokenizer gives id {self.ours} at position {self.position}, "
                f"the server's {self.theirs}")


def first_difference(probe: Probe, theirs: list[list[int]]) -> Difference | None:
    """The first id where the server's answer differs from the run's, or None when every id matches."""
    if len(theirs) != len(probe.texts):
        return Difference(f"{len(probe.texts)} probe texts", 0, len(probe.texts), len(theirs))
    for text, ours, them in zip(probe.texts, probe.ids, theirs):
        if ours != them:
            at = next((i for i, (a, b) in enumerate(zip(ours, them)) if a != b), min(len(ours), len(them)))
            return Difference(text, at, ours[at] if at < len(ours) else None, them[at] if at < len(them) else None)
    return None
