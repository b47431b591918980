"""How a prompt travels on the broker: token ids packed as base64 int32.

A JSON list of 300 ids costs about 1.9 KB on the broker and is slow to encode;
little-endian int32 in base64 costs 4/3 bytes per byte of ids and stays JSON,
so no pickle is ever needed.
"""
from __future__ import annotations

import base64
from array import array
from sys import byteorder


def pack_ids(ids: list[int]) -> str:
    packed = array("i", ids)
    if byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def unpack_ids(text: str) -> list[int]:
    packed = array("i")
    packed.frombytes(base64.b64decode(text))
    if byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def task_argsrepr(run: str, prompt_id: str, n_tokens: int) -> str:
    """What Flower and the logs show instead of thousands of token ids."""
    return f"(run={run!r}, id={prompt_id!r}, prompt_tokens={n_tokens})"
