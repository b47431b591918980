"""A count with its noun, as the commands and the worker's log print it: "1 file", "2 files",
"1,024 samples", "0.25 cores".

One home, so nothing prints "1 files" or "1 core(s)" again; the nouns are English ones whose
plural adds an s unless given. The noun is singular exactly where the count reads "1".
"""
from __future__ import annotations


def counted(n: float, noun: str, plural: str | None = None, spec: str = ",") -> str:
    """`n` formatted with `spec` (thousands separated by default; ".3g" for a share of cores), and
    its noun."""
    shown = f"{n:{spec}}"
    return f"{shown} {noun if shown == '1' else plural or noun + 's'}"
