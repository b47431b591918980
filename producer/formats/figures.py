"""What a format's manifest entry says about its rows: counts, token sums, an id-set digest.

`ids_sha256` is the sum, modulo 2^256, of the SHA-256 of each row's id (as
UTF-8; the prompt's id, the Parquet `id`, also where a trainer's line names the
sample), in hex. Addition commutes, so the digest does not depend on row order
and is built while streaming, holding no set of ids; two exports hold the same
ids (one row each) iff their digests and row counts agree, short of a SHA-256
collision. A conversation turn's id is its own prompt id, so turns count apart.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .rows import Row

MODULUS = 2**256


@dataclass
class Figures:
    rows: int = 0
    conversation_rows: int = 0   # rows that are a turn of a conversation
    prompt_tokens: int = 0        # mask 0
    generated_tokens: int = 0     # mask 1: the loss mask's sum
    max_row_tokens: int = 0       # set a trainer's max length at least this high, or rows are cut
    rows_without_generated_tokens: int = 0  # both trainers drop these (nothing to learn)
    _digest: int = 0

    def add(self, row: Row) -> None:
        self.count(row.id, row.prompt_len, len(row.input_ids) - row.prompt_len, row.conversation)

    def count(self, prompt_id: str, prompt_len: int, generated: int, conversation: str | None) -> None:
        self.rows += 1
        self.conversation_rows += conversation is not None
        self.prompt_tokens += prompt_len
        self.generated_tokens += generated
        self.max_row_tokens = max(self.max_row_tokens, prompt_len + generated)
        self.rows_without_generated_tokens += generated == 0
        self._digest = (self._digest + id_hash(prompt_id)) % MODULUS

    def add_columns(self, ids: list[str], prompt_len, output_len, conversation=None) -> None:
        """Many rows at once: `prompt_len` and `output_len` Arrow int arrays, `conversation`
        an Arrow string array or None (files written before the column)."""
        import pyarrow.compute as pc

        total = pc.add(prompt_len, output_len)
        self.rows += len(ids)
        self.conversation_rows += 0 if conversation is None else len(conversation) - conversation.null_count
        self.prompt_tokens += pc.sum(prompt_len).as_py() or 0
        self.generated_tokens += pc.sum(output_len).as_py() or 0
        self.max_row_tokens = max(self.max_row_tokens, pc.max(total).as_py() or 0)
        self.rows_without_generated_tokens += pc.sum(pc.equal(output_len, 0)).as_py() or 0
        self._digest = (self._digest + sum(map(id_hash, ids))) % MODULUS

    def to_dict(self) -> dict:
        return {"rows": self.rows, "conversation_rows": self.conversation_rows,
                "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                "loss_mask_ones": self.generated_tokens, "max_row_tokens": self.max_row_tokens,
                "rows_without_generated_tokens": self.rows_without_generated_tokens,
                "ids_sha256": ids_digest_hex(self._digest)}


def id_hash(prompt_id: str) -> int:
    return int.from_bytes(hashlib.sha256(prompt_id.encode("utf-8", "surrogatepass")).digest(), "big")


def ids_digest_hex(value: int) -> str:
    return f"{value:064x}"


def ids_digest(ids) -> str:
    """The digest of a collection of ids, for a reader checking an export."""
    return ids_digest_hex(sum(id_hash(i) for i in ids) % MODULUS)
