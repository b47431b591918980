"""The shard contract: Parquet columns, and the `Sample` record a worker fills.

A shard is a Parquet file (or object) under `OUTPUT_DIR/<run>/` whose name does
not start with `.` or `_` (temporary and metadata files). `input_ids` is the prompt's
ids then the server's `output_ids`, exactly; `prompt_len` says where one ends.
The Arrow schema is built from `Sample`'s fields, so the record a worker fills
and the columns a reader sees cannot drift apart; pyarrow is imported only
when the schema is asked for.

A row of a regenerated conversation (`enqueue --turns all`) is one assistant
turn: `conversation` is the conversation's id, `turn` the 0-based index of the
assistant turn within it, and `id` the turn's prompt id,
`<conversation id>#<turn>`. Its `input_ids` are that turn's prompt (the
template's rendering of the history with the model's own earlier answers) then
its output ids, exactly as for a single prompt, whose two columns are null.

A row of a run of several samples a prompt (`enqueue --samples N`) keeps the
prompt's (its line's) id in `id`, the sample's 0-based index in `sample` and
the `sampling_seed` it was asked with in `seed` (`contract/run/samples.py`): (`id`,
`sample`) names a row. Every row written since samples exist has both (sample 0
in a run of one sample a prompt); an older shard's read as nulls, i.e. sample 0.

`cached_tokens` is the server's `meta_info.cached_tokens` for the stored
generation (prompt tokens found in its prefix cache), null where the server
did not say. `verified` and `verdict` are the run's verifier's judgement of the
answer (`enqueue --verify`, `contract/run/verifiers.py`): whether it passed, and
its label (`pass`, `fail`, a user function's own, `error: ...` where the check
raised or ran out of time); null in a run without a verifier. `max_new_tokens`, `temperature`, `top_p`, `top_k` and `min_p` are
the sampling parameters as sent (a line's own over the run's, the budget after
any cut to the server's context; `top_k` and `min_p` null where neither gave
one). `logprobs`, `top_logprob_ids` and `top_logprobs` hold a `--logprobs K`
run's log-probabilities, laid out as `contract/run/logprobs.py` says, null
otherwise. `weight_version` is the weights that made the answer (its
`meta_info.weight_version`, SGLang's `--weight-version`, which
`/update_weights_from_disk` changes mid-run; `contract/fleet/provenance.py`).
Columns are only ever added at the end: readers open shards with
`arrow_schema()`, so an older shard without a newer column reads as nulls.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from functools import lru_cache
from pathlib import Path

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Sample:
    id: str
    input_ids: list[int]
    prompt_len: int
    output_len: int
    finish_reason: str | None
    stop_token: int | None
    think_end_index: int | None
    run: str
    server: str
    model: str | None
    max_new_tokens: int | None
    temperature: float | None
    top_p: float | None
    attempts: int
    worker: str
    tokenizer_fingerprint: str
    template_fingerprint: str
    e2e_latency: float | None
    started_at: datetime
    finished_at: datetime
    conversation: str | None = None  # the conversation's id; None for a single prompt
    turn: int | None = None          # 0-based index of the assistant turn in it; None for a single prompt
    cached_tokens: int | None = None  # prompt tokens the server found in its prefix cache; None: not reported
    verified: bool | None = None     # the run's verifier passed the answer (`enqueue --verify`); None: no verifier
    verdict: str | None = None       # its label: pass, fail, a function's own, or `error: ...` (contract/run/verifiers.py)
    top_k: int | None = None          # as sent (a line's own sampling, else the run's); None: not sent
    min_p: float | None = None        # as sent; None: not sent
    logprobs: list[float] | None = None         # `--logprobs K`: each output token's (contract/run/logprobs.py)
    top_logprob_ids: list[int] | None = None    # K candidates per output token, flattened row-major
    top_logprobs: list[float] | None = None     # their log-probabilities, in the same order
    weight_version: str | None = None  # the answer's meta_info.weight_version (else the server's); None: older shard
    sample: int | None = None         # 0-based index of the sample of its prompt (`enqueue --samples`)
    seed: int | None = None           # the `sampling_seed` sent for it (contract/run/samples.py)


# Arrow type of each column, by name: the order is Sample's.
_TYPES = {
    "id": "string", "input_ids": "list<int32>", "prompt_len": "int32", "output_len": "int32",
    "finish_reason": "string", "stop_token": "int32", "think_end_index": "int32", "run": "string",
    "server": "string", "model": "string", "max_new_tokens": "int32", "temperature": "float32",
    "top_p": "float32", "attempts": "int16", "worker": "string", "tokenizer_fingerprint": "string",
    "template_fingerprint": "string", "e2e_latency": "float32", "started_at": "timestamp[ms, UTC]",
    "finished_at": "timestamp[ms, UTC]",
    "conversation": "string", "turn": "int16", "cached_tokens": "int32",
    "verified": "bool_", "verdict": "string",
    "top_k": "int32", "min_p": "float32", "logprobs": "list<float32>", "top_logprob_ids": "list<int32>",
    "top_logprobs": "list<float32>",
    "weight_version": "string",
    "sample": "int32", "seed": "int64",
}
COLUMNS = tuple(f.name for f in fields(Sample))


@lru_cache(maxsize=1)
def arrow_schema():
    import pyarrow as pa

    def arrow_type(name: str):
        if name.startswith("list<"):
            return pa.list_(getattr(pa, name[5:-1])())
        if name.startswith("timestamp"):
            return pa.timestamp("ms", tz="UTC")
        return getattr(pa, name)()

    return pa.schema([(column, arrow_type(_TYPES[column])) for column in COLUMNS])


# The log-probabilities' floats (`--logprobs K`, up to 21 a token) are each a model's own digits: a
# dictionary of them costs more than it saves, while splitting their bytes into streams lets zstd
# pack their signs and exponents (measured at K = 20: 62 bytes a token for the 20 top floats,
# against 71 plain and 82 with a dictionary; docs/data/shards.md). Readers: pyarrow, DuckDB, Spark 3.2+.
FLOAT_LISTS = ("logprobs", "top_logprobs")
SPLIT_STREAMS = tuple(f"{c}.list.element" for c in FLOAT_LISTS)


def write_options() -> dict:
    """`pyarrow.parquet.write_table` options of a shard: zstd, dictionary pages for every column but
    the log-probability floats, which are byte-stream-split."""
    paths = [f"{f.name}.list.element" if f.type.num_fields else f.name for f in arrow_schema()]
    return {"compression": "zstd", "use_dictionary": [p for p in paths if p not in SPLIT_STREAMS],
            "use_byte_stream_split": list(SPLIT_STREAMS)}


def samples_to_table(samples: list[Sample]):
    """One Arrow table of many samples, column by column."""
    import pyarrow as pa

    columns = [[getattr(s, c) for s in samples] for c in COLUMNS]
    return pa.Table.from_arrays([pa.array(list(c), type=t) for c, t in zip(columns, arrow_schema().types)],
                                schema=arrow_schema())


def is_shard(path: Path) -> bool:
    """Names starting with `.` or `_` are temporary or metadata files."""
    return path.suffix == ".parquet" and not path.name.startswith((".", "_"))
