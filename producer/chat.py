"""The chat tokenizer lives in `contract.chat` (workers render conversation turns with it too)."""
from contract.chat import PROBE, ChatTokenizer

__all__ = ["PROBE", "ChatTokenizer"]
