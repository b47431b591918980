"""How a prompt's token ids are stored.

Token ids are kept once per queued prompt in the run's ledger (raw bytes in a
Redis hash), and the broker message carries only the run and prompt id. That
lets a worker republish a message the broker lost and keeps pickle off the
broker. Every real vocabulary is smaller than 2^24, so the ledger keeps three
bytes a token (a leading byte says the width; ids at or past 2^24 fall back to
four). Dead letters, which are JSON, hold the ids as base64 of little-endian
int32, the form other tools read without this module.
"""
from __future__ import annotations

import base64
from array import array
from sys import byteorder

_NARROW = 3   # bytes a token when every id fits in 24 bits
_WIDE = 4


def _int32_le(ids: list[int]) -> bytes:
    packed = array("i", ids)
    if byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _from_int32_le(raw: bytes | bytearray) -> list[int]:
    packed = array("i")
    packed.frombytes(raw)
    if byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def pack_ids(ids: list[int]) -> bytes:
    """Ledger form: a width byte, then each id in 3 (or 4) little-endian bytes."""
    wide = _int32_le(ids)
    if wide[_NARROW::_WIDE].count(0) != len(ids):  # an id past 2^24 (or negative): keep 4 bytes
        return bytes([_WIDE]) + wide
    narrow = bytearray(1 + _NARROW * len(ids))
    narrow[0] = _NARROW
    for byte in range(_NARROW):  # drop every id's fourth (always zero) byte
        narrow[1 + byte::_NARROW] = wide[byte::_WIDE]
    return bytes(narrow)


def unpack_ids(raw: bytes) -> list[int]:
    width, body = raw[0], memoryview(raw)[1:]
    if width == _WIDE:
        return _from_int32_le(body)
    if width != _NARROW or len(body) % _NARROW:
        raise ValueError(f"not a packed id list (width byte {width}, {len(body)} bytes)")
    wide = bytearray(_WIDE * (len(body) // _NARROW))
    for byte in range(_NARROW):
        wide[byte::_WIDE] = body[byte::_NARROW]
    return _from_int32_le(wide)


def count_ids(raw: bytes) -> int:
    """How many token ids a packed list holds, without unpacking it."""
    return (len(raw) - 1) // raw[0]


def ids_to_b64(ids: list[int]) -> str:
    return base64.b64encode(_int32_le(ids)).decode("ascii")


def b64_to_ids(text: str) -> list[int]:
    return _from_int32_le(base64.b64decode(text))


def task_argsrepr(run: str, prompt_id: str, n_tokens: int) -> str:
    """What Flower and the logs show for a task: never the token ids."""
    return f"(run={run!r}, id={prompt_id!r}, prompt_tokens={n_tokens})"
