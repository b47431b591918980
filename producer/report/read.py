"""Reading a run for its report: shards as record batches, dead letters one at a time.

Memory stays bounded by one batch of one shard (in a bucket: by one shard),
whatever the run's size: the shards are read one at a time as pyarrow record batches of a few hundred
rows, with only the columns the figures need and no read-ahead;
dead letters come from Redis by HSCAN, a page at a time. Nothing here builds a
list of the run's samples.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import redis

from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.storage import store_for

# Every column but `run` (the folder says it): input_ids for the output's hash and last token.
COLUMNS = ("id", "input_ids", "prompt_len", "output_len", "finish_reason", "stop_token", "think_end_index",
           "server", "model", "max_new_tokens", "temperature", "top_p", "attempts", "worker",
           "tokenizer_fingerprint", "template_fingerprint", "e2e_latency", "started_at", "finished_at",
           "cached_tokens", "sample")  # a shard older than a column has no such column in its batches
BATCH_ROWS = 256


def shard_batches(output_dir: str, run: str, columns: tuple[str, ...] = COLUMNS,
                  batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Each shard in name order, `batch_rows` rows at a time, only `columns`.

    One shard at a time on this thread (in a bucket, one object in memory at a
    time): a dataset scanner reads ahead on its own threads, and on a slow
    consumer (the hashing) it buffered ~all the run's compressed bytes before
    the consumer caught up.
    """
    store = store_for(output_dir)
    for location in store.shards(run):
        with pq.ParquetFile(store.source(location)) as shard:
            for batch in shard.iter_batches(batch_size=batch_rows, columns=list(columns), use_threads=False):
                if batch.num_rows:
                    yield batch


def dead_letters(client: redis.Redis, run: str) -> Iterator[DeadLetter]:
    return iter(DeadLetters(client, run))
