"""Text from a prompt, an answer or a dead letter, made safe to print on a terminal.

Prompts come from scraped datasets and answers from a model: either may hold
terminal control sequences (`ESC ] 0 ; title BEL` sets a terminal's title,
`ESC [ 2 J` clears its screen, and some terminals act on far worse). Every
command that prints such text (`show`, `dead show`, `dead list`, `status`,
`enqueue`'s rejected lines, the demo) passes it through `visible` first, so
a control character is shown as its escape (`\\x1b`), never sent raw. The
characters escaped: C0 and C1 controls and DEL, the bidirectional overrides
and isolates (which reorder what a reader sees), line and paragraph
separators, surrogates. Newline and tab stay as they are in multi-line text
(`lines=True`: a decoded prompt keeps its lines), and are escaped in one-line
text (a table cell, a log-like line).
"""
from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_ONE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")
_MULTI_LINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")


def visible(text: str, lines: bool = False) -> str:
    """`text` with each control character shown as its Python escape (`\\x1b`, `\\u202e`);
    `lines`: newlines and tabs kept."""
    return (_MULTI_LINE if lines else _ONE_LINE).sub(_escaped, text)


def _escaped(match: re.Match) -> str:
    return ascii(match.group())[1:-1]


def cell(text: str):
    """`text` for a rich table cell: one line, controls shown, never read as markup."""
    from rich.text import Text

    return Text(visible(text))
