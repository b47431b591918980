"""A count with its noun, as the commands print it: "1 file", "2 files", "1,024 samples".

One home, so no command prints "1 files" again; the nouns are English ones whose plural
adds an s unless given.
"""
from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
