"""How a prompt's token ids are kept in the ledger and in dead letters."""
from __future__ import annotations

import base64
import random
import struct

import pytest

from contract.ledger.codec import b64_to_ids, ids_to_b64, pack_ids, unpack_ids

VOCABULARIES = [129_280, 151_936, 256_000]  # DeepSeek-V3/R1, Qwen, Gemma


@pytest.mark.parametrize("vocab", VOCABULARIES)
def test_ids_of_real_vocabularies_take_three_bytes_and_come_back_exactly(vocab):
    # Given a 300-token prompt over a real vocabulary size, both ends of it included
    ids = [0, vocab - 1] + [random.randrange(vocab) for _ in range(298)]

    # When the ledger packs it
    packed = pack_ids(ids)

    # Then it takes 3 bytes a token (and a width byte), and unpacks to the same ids
    assert len(packed) == 1 + 3 * len(ids)
    assert unpack_ids(packed) == ids


@pytest.mark.parametrize("ids", [[2**24], [5, 2**24 + 7, 1], [2**31 - 1]], ids=["2^24", "mixed", "int32-max"])
def test_ids_past_24_bits_fall_back_to_four_bytes(ids):
    packed = pack_ids(ids)
    assert len(packed) == 1 + 4 * len(ids)
    assert unpack_ids(packed) == ids


def test_an_empty_prompt_round_trips():
    assert unpack_ids(pack_ids([])) == []


def test_dead_letters_hold_plain_little_endian_int32_in_base64():
    # Given ids, when a dead letter encodes them, then any tool reads them as int32 little-endian
    ids = [1, 128_821, 2**24 + 3]
    raw = base64.b64decode(ids_to_b64(ids))
    assert list(struct.unpack(f"<{len(ids)}i", raw)) == ids
    assert b64_to_ids(ids_to_b64(ids)) == ids


def test_bytes_that_are_not_a_packed_list_are_refused():
    with pytest.raises(ValueError, match="not a packed id list"):
        unpack_ids(b"\x07abc")
