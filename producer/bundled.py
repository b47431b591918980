"""The bundled tokenizer lives in `contract.bundled` (workers load it to render conversation turns)."""
from contract.bundled import BUNDLED_NAME, bundled_tokenizer_dir, resolve_tokenizer

__all__ = ["BUNDLED_NAME", "bundled_tokenizer_dir", "resolve_tokenizer"]
