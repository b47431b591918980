"""Reading a run for its report: shards as record batches, dead letters one at a time.

Memory stays bounded by one batch of one shard, whatever the run's size: the
shards are scanned as a pyarrow dataset, a few hundred rows at a time, with
only the columns the figures need and no read-ahead beyond the next batch;
dead letters come from Redis by HSCAN, a page at a time. Nothing here builds a
list of the run's samples.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import redis

from contract.deadletters import DeadLetter, DeadLetters
from contract.schema import arrow_schema, shard_files

# Every column but `run` (the folder says it): input_ids for the output's hash and last token.
COLUMNS = ("id", "input_ids", "prompt_len", "output_len", "finish_reason", "stop_token", "think_end_index",
           "server", "model", "max_new_tokens", "temperature", "top_p", "attempts", "worker",
           "tokenizer_fingerprint", "template_fingerprint", "e2e_latency", "started_at", "finished_at")
BATCH_ROWS = 256


def run_dataset(output_dir: str, run: str) -> ds.Dataset | None:
    """The run's shards as one dataset (the shard schema, so older files line up), or None."""
    files = shard_files(output_dir, run)
    if not files:
        return None
    return ds.dataset([str(f) for f in files], schema=arrow_schema(), format="parquet")


def shard_batches(output_dir: str, run: str, columns: tuple[str, ...] = COLUMNS,
                  batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    dataset = run_dataset(output_dir, run)
    if dataset is None:
        return
    for batch in dataset.to_batches(columns=list(columns), batch_size=batch_rows,
                                    batch_readahead=1, fragment_readahead=1):
        if batch.num_rows:
            yield batch


def dead_letters(client: redis.Redis, run: str) -> Iterator[DeadLetter]:
    return iter(DeadLetters(client, run))
