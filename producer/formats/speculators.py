"""`export --format speculators`: JSONL rows of `input_ids` and `loss_mask`, speculators' speculator-format rows.

speculators 0.9.0 `prepare-data --data DEST/speculators.jsonl` loads a local
`.jsonl` file with HF `datasets` (`load_raw_dataset`), sees both `input_ids` and
`loss_mask` columns, and passes each row through (`_passthrough_pretokenized`):
ids and mask as given, cut to `--seq-length` (default 8192: set it to at least
the manifest's `max_row_tokens`), rows with no mask-1 token dropped, other
columns (`id`) removed, then the rows are shuffled and saved with
`save_to_disk`; training's `ArrowDataset` reads that folder back. Pass the file,
not DEST: given a folder, prepare-data reads every `*.json` under it, the
manifest too. The mask is 1 exactly on generated tokens and 0 on the prompt, the
think-start token a template appends to the prompt included
(`producer/formats/rows.py` says why). A conversation gives one row per stored
turn, as speculators' own rendering does (`_render_boundary_rows`: one row per
assistant turn, history masked 0), with the history here token-exact as served.
"""
from __future__ import annotations

from typing import Callable

from contract.run.spec import RunSpec

from .rows import Row, token_line_maker

FILE = "speculators.jsonl"


def line_maker(spec: RunSpec, options: dict) -> Callable[[Row], str]:
    return token_line_maker(spec)
