"""An exported row, as the trainers' formats see it, and the loss mask every format shares.

A row is one stored sample: one prompt, or one turn of a conversation. Its
`input_ids` are the prompt's ids (for a turn: the whole history as the template
rendered it) followed by the ids the server generated, and `prompt_len` says
where one ends. The loss mask is therefore `[0] * prompt_len + [1] * output_len`
exactly: 1 on every generated token (the think-start token too where the model
emitted it, `--thinking output`; the think-end token, the answer, the final stop
token) and 0 on every prompt token (the think-start token a template put at the
end of the prompt, `--thinking prompt`, included: the model did not generate it,
and a drafter that learned to predict it would be learning the template, not the
model; at serving time it sits in the prompt the drafter is conditioned on).
Each turn of a conversation is its own row: its prompt already holds the full
history, and only that turn's answer is masked 1, so no token is supervised twice.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator

import pyarrow.parquet as pq

from contract.run.samples import row_key
from contract.run.spec import RunSpec

READ_COLUMNS = ["id", "sample", "conversation", "turn", "input_ids", "prompt_len", "output_len", "finish_reason",
                "stop_token", "think_end_index"]
BATCH_ROWS = 512


@dataclass(frozen=True)
class Row:
    id: str
    input_ids: list[int]
    prompt_len: int
    output_len: int = 0
    finish_reason: str | None = None
    stop_token: int | None = None
    think_end_index: int | None = None
    conversation: str | None = None
    turn: int | None = None
    sample: int | None = None  # its index among its prompt's samples (null in shards older than samples: 0)

    @property
    def prompt_ids(self) -> list[int]:
        return self.input_ids[:self.prompt_len]

    @property
    def output_ids(self) -> list[int]:
        return self.input_ids[self.prompt_len:]


def loss_mask(row: Row) -> list[int]:
    """1 exactly on the generated tokens (module docstring)."""
    return [0] * row.prompt_len + [1] * (len(row.input_ids) - row.prompt_len)


def mask_json(row: Row) -> str:
    """`loss_mask(row)` as JSON text, built without a list of ints (rows run to 10^5 tokens)."""
    generated = len(row.input_ids) - row.prompt_len
    return "[" + ",".join(("0",) * row.prompt_len + ("1",) * generated) + "]"


def read_rows(paths: list) -> Iterator[Row]:
    """The rows of Parquet files in the shard schema, a batch at a time. Files written before
    the `conversation` and `turn` columns existed read them as null."""
    for path in paths:
        shard = pq.ParquetFile(path)
        present = set(shard.schema_arrow.names)
        for batch in shard.iter_batches(batch_size=BATCH_ROWS, columns=[c for c in READ_COLUMNS if c in present]):
            columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
            for i in range(batch.num_rows):
                yield Row(**{name: values[i] for name, values in columns.items()})


def token_line(row: Row, samples: int = 1) -> str:
    """`{"id", "input_ids", "loss_mask"}` as one JSON line: what both trainers read pre-tokenized.
    The id names the row: the prompt's (a turn's is `<conversation>#<turn>`), and in a run of
    `samples` > 1 samples a prompt the sample's key, `<id>~<index>` (`contract/run/samples.py`),
    so no two lines share one. It is the only other key: a key that is null in some rows and a
    string in others can stop a block-wise JSON reader (HF `datasets`)."""
    name = row_key(row.id, row.sample, samples)
    return f'{{"id":{json.dumps(name)},"input_ids":{json.dumps(row.input_ids, separators=(",", ":"))},"loss_mask":{mask_json(row)}}}'


def token_line_maker(spec: RunSpec) -> Callable[[Row], str]:
    """`token_line` for the rows of the run `spec` describes."""
    return partial(token_line, samples=spec.samples)
