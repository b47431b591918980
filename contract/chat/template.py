"""Prompts to token ids with the model's own chat template.

The token ids a worker sends are exactly what `apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)` gives. For a reasoning model whose
template opens the reasoning itself (DeepSeek-R1, Kimi-K2.5, Qwen3-Thinking),
every prompt must end with the think-start token (and whatever whitespace the
template puts after it); the producer checks that rather than trust it.

It lives in `contract` because both sides render: the producer a prompt (or a
conversation's first turn), a worker the next turn of a conversation
(`contract/chat/conversations.py`), with the same code, so the same history gives
the same ids wherever it is rendered. transformers is imported when a
tokenizer is loaded, never when the module is.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from contract.chat.bundled import resolve_tokenizer
from contract.names import Thinking

log = logging.getLogger(__name__)
PROBE = [{"role": "user", "content": "Hello"}]


# What AutoTokenizer resolves a plain `tokenizer.json` folder to (the bundled tokenizer and copies of it).
_PLAIN_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path_or_id: str, trust_remote_code: bool = False):
    """The transformers tokenizer, as `AutoTokenizer.from_pretrained` loads it.

    A local folder whose tokenizer_config.json names the plain fast class, with no
    auto_map and no model config.json, is loaded by that class directly: it is the class
    AutoTokenizer picks for it, and skipping AutoTokenizer skips importing transformers'
    model registry (about half a second of CPU in every producer command that renders)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    folder = Path(path_or_id)
    if folder.is_dir() and not (folder / "config.json").exists():
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text())
        except (OSError, ValueError):
            config = {}
        if config.get("tokenizer_class") in _PLAIN_CLASSES and "auto_map" not in config:
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path_or_id, trust_remote_code=trust_remote_code)


class ChatTokenizer:
    def __init__(self, name_or_path: str, trust_remote_code: bool = False,
                 think_start: str = "<think>", think_end: str = "</think>"):
        self.name = name_or_path
        self.tok = load_tokenizer(resolve_tokenizer(name_or_path), trust_remote_code)
        if not self.tok.chat_template:
            raise ValueError(f"tokenizer {name_or_path!r} has no chat template")
        self.think_start_id = self.token_id(think_start)
        self.think_end_id = self.token_id(think_end)
        self._think_tail: list[int] | None = None
        self._fingerprint: str | None = None

    def token_id(self, token: str) -> int | None:
        """The id of a single token named by its text, or None when the vocabulary lacks it."""
        tid = self.tok.convert_tokens_to_ids(token)
        if tid is None or tid == self.tok.unk_token_id:
            ids = self.tok.encode(token, add_special_tokens=False)
            return ids[0] if len(ids) == 1 else None
        return tid

    def render(self, conversations: list[list[dict]]) -> list[list[int]]:
        """Token ids of each conversation with the generation prompt appended."""
        if self.tok.is_fast:  # render, then encode in Rust directly: the same ids, less Python
            texts = self.tok.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
            return [e.ids for e in self.tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
        return [self.render_one(c) for c in conversations]

    def render_one(self, messages: list[dict]) -> list[int]:
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
        return list(ids)

    def detect_thinking(self) -> str:
        """Where think-start goes: in the prompt (template), in the output (model), or nowhere."""
        if self.think_start_id is None or self.think_end_id is None:
            return Thinking.OFF.value
        probe = self.render_one(PROBE)
        tail = self._tail_after_think_start(probe)
        return Thinking.PROMPT.value if tail is not None else Thinking.OUTPUT.value

    def ends_with_think_start(self, ids: list[int]) -> bool:
        if self._think_tail is None:
            self._think_tail = self._tail_after_think_start(self.render_one(PROBE)) or []
        n = len(self._think_tail)
        return len(ids) > n and ids[len(ids) - n - 1] == self.think_start_id and ids[len(ids) - n:] == self._think_tail

    def _tail_after_think_start(self, ids: list[int]) -> list[int] | None:
        """Tokens after a think-start among the last few, if they are only whitespace."""
        for back in range(1, min(5, len(ids)) + 1):
            if ids[-back] == self.think_start_id:
                tail = ids[len(ids) - back + 1:]
                return tail if not self.tok.decode(tail).strip() else None
        return None

    def renders_history_reasoning(self) -> bool:
        """Whether the template renders an earlier assistant turn's `reasoning_content` (a probe
        conversation rendered with and without it). DeepSeek-R1, Qwen3 and Kimi templates drop
        it, and so does the bundled one: then a conversation need not keep it for later turns."""
        answer = {"role": "assistant", "content": "Probe answer."}
        probe = [PROBE[0], {**answer, "reasoning_content": "Probe reasoning."}, {"role": "user", "content": "Again"}]
        plain = [PROBE[0], answer, probe[2]]
        return self.render([probe]) != self.render([plain])

    def stop_ids(self) -> list[int]:
        eos = self.tok.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos or [])

    def fingerprint(self) -> str:
        """A hash of the vocabulary and special tokens (a few tenths of a second: computed once)."""
        if self._fingerprint is None:
            vocab = sorted(self.tok.get_vocab().items(), key=lambda item: item[1])
            blob = json.dumps([vocab, sorted(self.tok.all_special_tokens)], ensure_ascii=False).encode()
            self._fingerprint = hashlib.sha256(blob).hexdigest()[:16]
        return self._fingerprint

    def template_fingerprint(self) -> str:
        template = self.tok.chat_template
        if isinstance(template, dict):
            template = json.dumps(template, sort_keys=True)
        return hashlib.sha256(str(template).encode()).hexdigest()[:16]
