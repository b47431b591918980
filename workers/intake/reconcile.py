"""A sample stored just before its worker died is found, not generated again.

A group commit is two effects in two systems: the shard (given its final name
once durable: a hard link in a folder, a create-only upload in a bucket,
`contract/storage`) and the ledger's `done`. A worker that dies between them
leaves a durable sample whose prompt is still queued, and the redelivery would
generate it again. So the group's ledger work brackets the write (`ShardBook`,
the shard writer's one way to Redis, one call each):

1. before the write, each row's prompt gets a writing entry naming the shard
   file's final name (`Ledger.writing`); a retry after a storage failure gets
   a new name and new entries, and a failed write drops the ones naming it
   (`Ledger.unwritten`), so a sample withdrawn meanwhile is left without one;
2. after the shard is created, the group is marked done in one script (`Ledger.mark_group_done`),
   which deletes the entries; only then are the tasks released (and acknowledged).
Both steps are confirmed on a replica before the writer goes on (`ShardBook`), so a
failover cannot take back an entry whose shard was linked, nor a done mark whose task
was acknowledged.

A delivery reads its prompt's ids and entry in one call (`Ledger.intake`). An
entry whose shard exists under that name (in the folder or bucket `OUTPUT_DIR`
names) and holds the prompt's id (its `id` and `output_len` columns are read,
once per shard) means the sample is durable there: the prompt is marked done
with that shard as its canonical copy, without generating (`reconciled`). An
entry whose shard is missing, or does not hold the id (the worker died before
its final name was made, or the file is on another node's disk), is dropped
and the prompt generated as usual. A final name is never replaced and holds the
rows it was written with (`contract/storage`), so the check cannot be fooled by
a later shard.

Rows are matched with the ledger by their ledger key (`contract/run/samples.py`):
a row's `id` is its prompt's, so in a run of several samples a prompt the key
is derived from its `id` and `sample` (`row_key`), with the run's `samples`
read from its spec once per process (`ShardBook.keys`).

The hash holds only in-flight groups (not one field per prompt of the run):
`mark_group_done` and `bury` delete entries, and one a dead worker left goes at
its prompt's next delivery (found, or dropped; `intake` drops the entry of a
prompt that is done or dead by then).
"""
from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq
import redis

from contract.broker import kombu_redis, kombu_take
from contract.storage import shard_home
from contract.ledger.ledger import Ledger
from contract.redis_link.write_refusal import refusal
from contract.names import PromptState
from contract.redis_link.replication import FailedOver, confirmed, replicated, written_again
from contract.run.samples import row_key
from contract.storage.schema import Sample, is_shard
from contract.run.verifiers import verdict_class
from contract.run.spec import load_spec
from contract.storage import store_for
from contract.counts import counted

from . import deliveries
from ..reporting import metrics
from .group_acks import GROUP_ACKS
from .recent import REMEMBER_S, Recent

log = logging.getLogger(__name__)


class LedgerRefused(OSError):
    """Redis refuses writes: a shard written now could not be noted, so it waits like a storage outage."""


class ShardBook:
    """The ledger's side of a group commit, for the shard writer's thread.

    Writing entries and done marks are reported only once a replica has them
    (`contract/redis_link/replication.confirmed`, the writes and their barrier in one round trip): an
    entry lost in a failover would leave a stored sample to be generated again, a lost done
    mark a prompt that `status` counts as queued until its lease runs out. A failover met on
    the way (`FailedOver`: the primary that took them was being replaced) is written again, at
    once, on the primary the Sentinels name now. What was marked done lately is remembered
    (`recent`) so a failover found later can assert it on the new primary (`workers/intake/failover.py`)."""

    def __init__(self, client: redis.Redis, home: str | None = None, remember: float = REMEMBER_S):
        self.client = client
        self.home = home  # this worker's OUTPUT_DIR (`contract.storage.shard_home.home`), noted in each run it writes
        self.homed: set[str] = set()  # runs whose home this process has noted
        self.recent = Recent(remember)  # (run, [(id, output_len)], shard) of the groups marked done lately
        self.samples: dict[str, int] = {}  # each run's samples a prompt (its spec's; never changes)

    def keys(self, run: str, rows: list[Sample]) -> list[str]:
        """The rows' ledger keys: their ids, or in a run of several samples a prompt each
        sample's `<id>~<index>` (the run's spec read once)."""
        if run not in self.samples:
            spec = load_spec(self.client, run)
            self.samples[run] = spec.samples if spec else 1
        samples = self.samples[run]
        return [row.id for row in rows] if samples == 1 else [row_key(row.id, row.sample, samples) for row in rows]

    def writing(self, run: str, rows: list[Sample], shard: str) -> None:
        """Raises `LedgerRefused` when Redis refuses the entries (or a failover outlasts
        `replication.AGAIN` writes): no shard without its entries, the writer holds the group and retries.
        Other Redis errors are let be: without entries a crash after the link costs a
        generation, no more. The first group of a run also notes, in the same round trip, where
        this worker writes its shards, so that commands read them there (`contract/storage/shard_home.py`)."""
        new_home = self.home if self.home and run not in self.homed else None

        def fill(pipe) -> None:
            Ledger(pipe, run).writing(ids, shard)
            if new_home:
                shard_home.record(pipe, run, new_home)
        try:
            ids = self.keys(run, rows)
            written_again(lambda: confirmed(self.client, fill),
                          f"the writing entries of {len(rows)} samples of run {run}")
            if new_home:
                self.homed.add(run)
        except redis.RedisError as exc:
            found = refusal(exc)
            if found is not None or isinstance(exc, FailedOver):
                raise LedgerRefused(found.line() if found else str(exc)) from exc
            log.warning("could not note %s of run %s as being written to %s (%r); a crash before they "
                        "are marked done would generate them again", counted(len(rows), "sample"), run, shard, exc)

    def unwritten(self, run: str, rows: list[Sample], shard: str) -> None:
        """Best effort: an entry left naming a file that was never linked is dropped at the
        prompt's next delivery."""
        try:
            Ledger(self.client, run).unwritten(self.keys(run, rows), shard)
        except redis.RedisError as exc:
            log.warning("could not drop the writing entries of %s of run %s (%r)", counted(len(rows), "sample"),
                        run, exc)

    def mark_done(self, run: str, rows: list[Sample], shard: str) -> None:
        """The group is durable in `shard`: mark it done, forget its deliveries and acknowledge
        the messages of its tasks (`group_acks`), in this order, one round trip (raises if Redis
        fails: its tasks then fail, and their redeliveries find the entries). Returns once a
        replica has the done marks, so no task is acknowledged for a prompt a failover could
        turn back to queued; a failover met on the way writes them again on the new primary."""
        keys = self.keys(run, rows)
        samples = [(key, row.output_len, verdict_class(row.verified, row.verdict)) for key, row in zip(keys, rows)]
        tags = GROUP_ACKS.claim(run, keys)
        found = written_again(lambda: self.mark(run, samples, shard, tags),
                              f"the done marks of {len(rows)} samples of run {run}")
        kombu_redis.settled(tags)
        self.recent.add((run, samples, shard))
        again = [key for key, state in zip(keys, found) if state not in (PromptState.QUEUED, PromptState.DEAD)]
        if again:
            log.warning("%s stored again (already done or not in the ledger), counted once: %s",
                        counted(len(again), "sample"), ", ".join(again[:10]))
        fresh = [row for row, state in zip(rows, found) if state in (PromptState.QUEUED, PromptState.DEAD)]
        if fresh:
            metrics.PROMPTS.labels(run, "stored").inc(len(fresh))
            metrics.TOKENS.labels("prompt").inc(sum(row.prompt_len for row in fresh))
            metrics.TOKENS.labels("output").inc(sum(row.output_len for row in fresh))

    def mark(self, run: str, samples: list[tuple[str, int]], shard: str,
             tags: list[str] = ()) -> list[str | None]:
        """Mark `samples` done in `shard`, forget their deliveries and acknowledge `tags` (their
        tasks' messages), confirmed on a replica; the state each was in (also how a failover's
        reassertion marks them again)."""
        done_replies = []

        def fill(pipe) -> None:
            Ledger(self.client, run).mark_group_done(samples, shard, pipe)
            done_replies.append(len(pipe))
            deliveries.clear(pipe, run, *(sample[0] for sample in samples))
            kombu_take.forget(pipe, tags)
        replies = confirmed(self.client, fill)
        return Ledger.found(replies[:done_replies[-1]])


def reconciled(ledger: Ledger, output_dir: str, prompt_id: str, shard: str, samples: int = 1) -> str | None:
    """The prompt's sample is in `shard` (its writing entry's name): mark it done there and say
    so; None when it is not (the entry is dropped and the prompt is to be generated). Raises
    `OSError` when storage cannot tell (the caller gives the prompt back, entry kept).
    `prompt_id` is the ledger key, in a run of `samples` samples a prompt."""
    location = store_for(output_dir).location(ledger.run, shard)
    if PurePosixPath(shard).name != shard or not is_shard(PurePosixPath(shard)):
        output_len = verdict = None  # not a final shard name: nothing to look for
    else:
        output_len, verdict = _output_len(output_dir, location, prompt_id, samples)
    if output_len is None:
        ledger.unwritten([prompt_id], shard)
        log.info("prompt %s: its sample was being written to %s, which does not hold it; generating it",
                 prompt_id, shard)
        return None
    with replicated(ledger.client):  # then the delivery is acknowledged
        found = ledger.mark_done(prompt_id, output_len, shard=shard, verdict=verdict)
    if found in (PromptState.QUEUED, PromptState.DEAD):
        metrics.PROMPTS.labels(ledger.run, "stored").inc()
        metrics.RECONCILED.inc()
    log.warning("prompt %s: its sample was stored in %s just before its worker died; marked done there, "
                "not generated again", prompt_id, shard)
    return f"reconciled: {location}"


def _output_len(output_dir: str, location: str, prompt_id: str, samples: int = 1) -> tuple[int | None, str | None]:
    """The prompt's row's output length in the shard at `location`, and its verdict class (None
    without a verifier); (None, None) when the shard or the row is not there."""
    try:
        return _rows_of(output_dir, location, samples).get(prompt_id, (None, None))
    except FileNotFoundError:  # not cached: a live worker may still create it
        return None, None
    except pa.ArrowInvalid as exc:  # never for a final name (created whole)
        log.warning("shard %s is unreadable (%s): not a place to find prompt %s in", location, exc, prompt_id)
        return None, None


@lru_cache(maxsize=4)
def _rows_of(output_dir: str, location: str, samples: int = 1) -> dict[str, tuple[int, str | None]]:
    """A shard's rows' ledger keys, output lengths and verdict classes (from the `id`, `sample`,
    `output_len`, `verified` and `verdict` columns only; an older shard without `sample` holds
    samples 0, one without verdicts none). A final name never changes its content, so the prompts
    of one dead worker's group read their shard once."""
    shard = pq.ParquetFile(store_for(output_dir).source(location))
    names = shard.schema_arrow.names
    columns = ["id", "output_len"] + ["sample"] * (samples > 1 and "sample" in names)
    columns += ["verified", "verdict"] * ("verdict" in names)
    table = shard.read(columns=columns)
    ids, lengths = table.column("id").to_pylist(), table.column("output_len").to_pylist()
    indices = table.column("sample").to_pylist() if "sample" in columns else [None] * len(ids)
    classes = ([verdict_class(v, d) for v, d in zip(table.column("verified").to_pylist(),
                                                    table.column("verdict").to_pylist())]
               if "verdict" in columns else [None] * len(ids))
    return {row_key(i, n, samples): (length, c) for i, n, length, c in zip(ids, indices, lengths, classes)}
