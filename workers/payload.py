"""How a prompt's token ids are stored: little-endian int32, 4 bytes a token.

Token ids are kept once per queued prompt in Redis (raw bytes in a hash), and
the broker message carries only the run and prompt id. That keeps Redis at
about 4 bytes per queued token plus a small per-message cost, lets a worker
republish a message the broker lost, and keeps pickle off the broker. Dead
letters, which are JSON, hold the same bytes in base64.
"""
from __future__ import annotations

import base64
from array import array
from sys import byteorder


def pack_ids(ids: list[int]) -> bytes:
    packed = array("i", ids)
    if byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(raw: bytes) -> list[int]:
    packed = array("i")
    packed.frombytes(raw)
    if byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def ids_to_b64(ids: list[int]) -> str:
    return base64.b64encode(pack_ids(ids)).decode("ascii")


def b64_to_ids(text: str) -> list[int]:
    return unpack_ids(base64.b64decode(text))


def task_argsrepr(run: str, prompt_id: str, n_tokens: int) -> str:
    """What Flower and the logs show for a task: never the token ids."""
    return f"(run={run!r}, id={prompt_id!r}, prompt_tokens={n_tokens})"
