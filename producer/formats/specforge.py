"""`export --format specforge`: JSONL rows of `input_ids` and `loss_mask`, SpecForge's pre-tokenized input.

SpecForge 0.2.0 reads such a file through `data.prompts_path` ("pre-tokenized
online data"): `specforge.data.prompt_builder.prepare_prompt_tasks` looks at the
first record, and when it holds both `input_ids` and `loss_mask` it takes every
line as it is (`_prompt_from_record`): ids and mask as given, cut to
`data.max_length` (default 2048: set it to at least the manifest's
`max_row_tokens`, or long traces lose their tail), rows whose mask sums to less
than the algorithm's minimum (1; 2 for DFlash-family drafters) dropped, other
keys (`id` here) ignored. It reads one file, so the export is one file:
`DEST/specforge.jsonl`. The mask is 1 exactly on generated tokens and 0 on the
prompt, the think-start token a template appends to the prompt included
(`producer/formats/rows.py` says why); nothing is re-rendered, so no regex over
text decides the mask. A conversation gives one row per stored turn.
"""
from __future__ import annotations

from typing import Callable

from contract.run.spec import RunSpec

from .rows import Row, token_line_maker

FILE = "specforge.jsonl"


def line_maker(spec: RunSpec, options: dict) -> Callable[[Row], str]:
    return token_line_maker(spec)
