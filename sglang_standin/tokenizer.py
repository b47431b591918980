"""The stand-in's tokenizer: the one in `--tokenizer-path`, when that is a local folder.

Why: real SGLang always has its model's tokenizer. It tokenizes `text` input
on `/generate`, answers `POST /tokenize`, and its vocabulary is the model's
(an id outside it ends the server: see `request_model.out_of_vocabulary`). The
stand-in has no checkpoint, so it uses the tokenizer it is given: a folder
holding `tokenizer.json` (and, for `max_model_len`, `tokenizer_config.json`),
as transformers' `save_pretrained` writes them. Loaded with the `tokenizers`
library (what transformers' fast tokenizers wrap), once per path. A hub id
such as the default `deepseek-ai/DeepSeek-R1` is no folder: then the stand-in
has no tokenizer, refuses `text` input and `/tokenize` with a 400 saying so,
and takes its vocabulary size from `--vocab-size`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

NO_TOKENIZER = ("The SGLang stand-in has no tokenizer (--tokenizer-path names no local folder with a "
                "tokenizer.json): send pre-tokenized input_ids instead of text.")


@dataclass(frozen=True)
class StandinTokenizer:
    """A loaded tokenizer and what SGLang reports of it."""

    tokenizer: Tokenizer
    model_max_length: int | None  # tokenizer_config.json's, as /tokenize's max_model_len

    @property
    def vocab_size(self) -> int:
        """Its length with the added (special) tokens, as `len(tokenizer)` in transformers."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@lru_cache(maxsize=8)
def load_tokenizer(path: str | None) -> StandinTokenizer | None:
    """The tokenizer in folder `path`, or None when `path` is not a folder with a tokenizer.json."""
    folder = Path(path) if path else None
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    return StandinTokenizer(Tokenizer.from_file(str(folder / "tokenizer.json")), _model_max_length(folder))


def _model_max_length(folder: Path) -> int | None:
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text()).get("model_max_length")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
