"""Parquet shards written by group commit.

A task hands its sample to the writer and waits; the writer gathers samples
until a shard is full or its oldest sample has waited `max_wait` seconds,
creates one Parquet shard through the store `OUTPUT_DIR` names
(`contract/storage`: in a folder, a temporary file fsynced and hard-linked
into place; in a bucket, one create-only upload), marks the whole group done
in the ledger in one call, and only then releases the waiting tasks, which
are then acknowledged. So an acknowledged
prompt is always in a shard and done, and shards stay large. Just before the
write, the group's prompts get writing entries naming the shard, so a worker
that dies between the link and the ledger's `done` leaves samples that their
redeliveries find rather than generate again (`workers/intake/reconcile.py`, the `book`).

Faults stay where they belong:
- A sample is checked when it is handed over (`check_sample`: ids are ints in
  the int32 range, lengths agree), and a row Arrow still refuses is found by
  building the group's rows one by one: either way only that row's task gets
  the error (`BadSample`), and the rest of its group is written.
- Storage refusing writes (any `OSError`: a full disk, a read-only or missing
  folder, a file where the run's folder should be; a bucket that cannot be
  reached, throttles or answers 5xx) is nobody's prompt's fault:
  the group goes back to the pending rows with its tasks still waiting, and
  is retried with backoff (on a probe file when nothing is pending) until
  storage takes it. `storage` says whether the last write worked and since
  when it fails; the health gate stops taking prompts meanwhile, and the
  change is logged once each way.
  A failed write drops the writing entries that name its file, and the
  retry names a new file, so an entry names the file being written or one
  that holds its row.
- A task that stops waiting (its deadline) `withdraw`s its sample, so a
  prompt given back is never written afterwards (nor left with an entry:
  entries are made only for the group being written).

Two workers never write the same shard, even when their node names and pids
coincide (containers where every worker is pid 1): each name carries a random
component, and the store creates a name only if it does not exist (a hard link;
`If-None-Match: *`), failing rather than replacing a shard.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow.parquet as pq

from contract.storage.schema import INT32_MAX, Sample, samples_to_table, write_options
from contract.storage import store_for
from contract.counts import counted

from ..reporting import lifeline, metrics

log = logging.getLogger(__name__)


class Book(Protocol):
    """The ledger's side of a group commit (`reconcile.ShardBook`)."""

    def writing(self, run: str, rows: list[Sample], shard: str) -> None: ...
    def unwritten(self, run: str, rows: list[Sample], shard: str) -> None: ...
    def mark_done(self, run: str, rows: list[Sample], shard: str) -> None: ...


class BadSample(ValueError):
    """This sample cannot be stored (the prompt's fault, never storage's)."""


class StorageUnavailable(OSError):
    """The writer cannot take or keep the sample (it is closed, or closed while storage refused
    the sample): its prompt goes back to the queue."""


def check_sample(row: Sample) -> None:
    """Refuse a row the shard schema cannot hold, before it joins a group."""
    ids = row.input_ids
    if not isinstance(ids, list) or not ids:
        raise BadSample(f"input_ids is not a non-empty list: {type(ids).__name__}")
    if set(map(type, ids)) != {int}:
        raise BadSample(f"input_ids holds {sorted({type(i).__name__ for i in ids} - {'int'})}, not only ints")
    if min(ids) < 0 or max(ids) > INT32_MAX:
        raise BadSample(f"input_ids outside 0..{INT32_MAX}: {min(ids)}..{max(ids)}")
    if row.prompt_len + row.output_len != len(ids) or row.prompt_len <= 0 or row.output_len < 0:
        raise BadSample(f"prompt_len {row.prompt_len} + output_len {row.output_len} != {len(ids)} ids")
    if row.think_end_index is not None and not row.prompt_len <= row.think_end_index < len(ids):
        raise BadSample(f"think_end_index {row.think_end_index} outside the output")


@dataclass
class StorageHealth:
    """Whether writes to OUTPUT_DIR work, as the writer last saw; logged once per change.
    `since` is this worker's wall time (for its own log lines); what others read is how long
    (`snapshot`'s `for_s`, on the monotonic clock), which they place on Redis's clock by the
    heartbeat's time, so a worker whose clock is off never shows a wrong age in `status`."""
    up: bool = True
    since: float = field(default_factory=time.time)
    last_error: str = ""
    failures: int = 0  # in a row
    _changed: float = field(default_factory=time.monotonic)

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{error.__class__.__name__}: {error}"
        if self.up:
            self.up, self.since, self._changed = False, time.time(), time.monotonic()
            log.error("storage failing: %s; holding finished samples and taking no new prompts until "
                      "it takes writes again", self.last_error)

    def recovered(self) -> None:
        if not self.up:
            log.warning("storage back after %.0fs (%d failed writes; last: %s)",
                        time.monotonic() - self._changed, self.failures, self.last_error)
            self.up, self.since, self._changed = True, time.time(), time.monotonic()
        self.failures = 0

    def retry_delay(self, base: float, cap: float) -> float:
        return min(cap, base * 2 ** max(0, self.failures - 1))

    def snapshot(self) -> dict:
        return {"up": self.up, "for_s": round(time.monotonic() - self._changed, 1), "last_error": self.last_error,
                "failures": self.failures}


@dataclass
class _Pending:
    rows: list[Sample] = field(default_factory=list)
    futures: list[Future] = field(default_factory=list)
    oldest: float = 0.0


class ShardWriter:
    """One per worker process; thread-safe."""

    def __init__(self, output_dir: str, worker: str, max_rows: int, max_wait: float,
                 retry_base: float = 0.5, retry_max: float = 5.0, book: Book | None = None,
                 commit_timeout: float | None = None):
        self.store = store_for(output_dir, commit_timeout)  # one call is bounded by the commit timeout
        self.book = book  # None: files only (the ledger is the caller's)
        self.worker = re.sub(r"[^A-Za-z0-9_.-]+", "-", worker).strip("-.") or "worker"
        self.max_rows, self.max_wait = max_rows, max_wait
        self.retry_base, self.retry_max = retry_base, retry_max
        self.storage = StorageHealth()
        self._pending: dict[str, _Pending] = {}
        self._failed_runs: set[str] = set()  # where storage last failed: what the probe tries
        self._retry_at = 0.0
        self._lock = threading.Condition()
        self._seq = 0
        self._closed = False
        self._thread = threading.Thread(target=lifeline.guarded("shard writer", self._run), name="fleet-shards",
                                        daemon=True)
        self._thread.start()

    def submit(self, run: str, row: Sample) -> Future:
        """Queue one sample; the future resolves to its shard's location once durable.
        Raises `BadSample` for a row no shard can hold."""
        check_sample(row)
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise StorageUnavailable("shard writer is closed")
            pending = self._pending.setdefault(run, _Pending())
            if not pending.rows:
                pending.oldest = time.monotonic()
            pending.rows.append(row)
            pending.futures.append(future)
            if len(pending.rows) >= self.max_rows:
                self._lock.notify()
        return future

    def withdraw(self, future: Future) -> bool:
        """Take back a sample still waiting for its shard; False once its write has begun
        (or is done), when the future is what tells how it ended."""
        with self._lock:
            for pending in self._pending.values():
                if future in pending.futures:
                    index = pending.futures.index(future)
                    del pending.rows[index], pending.futures[index]
                    return True
        return False

    def close(self) -> None:
        """Write what is pending (once more, whatever the backoff) and stop."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=120)

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                due, probe = self._wait_for_work()
                closing = self._closed
            if probe:
                self._probe()
            for run, pending in due:
                self._commit(run, pending)
            if closing:
                return

    def _wait_for_work(self) -> tuple[list[tuple[str, _Pending]], bool]:
        """Under the lock: groups to write now, and whether to probe failing storage."""
        while True:
            due = self._take_due()
            probe = not due and not self.storage.up and time.monotonic() >= self._retry_at
            if due or probe or self._closed:
                return due, probe
            self._lock.wait(self._sleep_time())

    def _take_due(self) -> list[tuple[str, _Pending]]:
        now = time.monotonic()
        if self._closed:
            due = [(run, p) for run, p in self._pending.items() if p.rows]
        elif not self.storage.up:  # all at once when the backoff is over
            due = [(run, p) for run, p in self._pending.items() if p.rows] if now >= self._retry_at else []
        else:
            due = [(run, p) for run, p in self._pending.items()
                   if p.rows and (len(p.rows) >= self.max_rows or now - p.oldest >= self.max_wait)]
        for run, _ in due:
            del self._pending[run]
        return due

    def _sleep_time(self) -> float:
        now = time.monotonic()
        if not self.storage.up:
            return max(0.01, self._retry_at - now)
        if not any(p.rows for p in self._pending.values()):
            return self.max_wait
        oldest = min(p.oldest for p in self._pending.values() if p.rows)
        return max(0.01, self.max_wait - (now - oldest))

    def _commit(self, run: str, pending: _Pending) -> None:
        table, _ = _to_table(pending.rows)
        if table is None and len(pending.rows) > 1:  # a row Arrow refuses: find it, keep the rest
            log.warning("a sample of run %s does not fit the shard schema; finding it", run)
            pending = self._fitting(pending)
            table = _to_table(pending.rows)[0] if pending.rows else None
        if table is None:
            for row, future in zip(pending.rows, pending.futures):
                self._commit_one(run, row, future)
            return
        self._write_group(run, pending, table)

    def _commit_one(self, run: str, row: Sample, future: Future) -> None:
        table, why = _to_table([row])
        if table is None:
            _refuse(row, future, why)
        else:
            self._write_group(run, _Pending([row], [future], time.monotonic()), table)

    def _fitting(self, pending: _Pending) -> _Pending:
        """The rows that fit the schema on their own; the others' tasks get `BadSample`."""
        kept = _Pending(oldest=pending.oldest)
        for row, future in zip(pending.rows, pending.futures):
            table, why = _to_table([row])
            if table is None:
                _refuse(row, future, why)
            else:
                kept.rows.append(row)
                kept.futures.append(future)
        return kept

    def _write_group(self, run: str, pending: _Pending, table) -> None:
        name = self._name()
        started = time.monotonic()
        try:
            if self.book:  # raises OSError when Redis refuses the note: held like a storage outage
                self.book.writing(run, pending.rows, name)
            path = self.store.create(run, name, lambda sink: pq.write_table(table, sink, **write_options()))
        except OSError as exc:  # storage, not the rows
            self._unwritten(run, pending, name)
            self._hold(run, pending, exc)
        except Exception as exc:  # not storage: one of the rows, which writing them alone finds
            self._unwritten(run, pending, name)
            if len(pending.rows) == 1:
                _refuse(pending.rows[0], pending.futures[0], repr(exc))
                return
            log.warning("shard of %s of run %s failed (%r); writing them one by one",
                        counted(len(pending.rows), "sample"), run, exc)
            for row, future in zip(pending.rows, pending.futures):
                self._commit_one(run, row, future)
        else:
            metrics.SHARD_COMMIT_SECONDS.observe(time.monotonic() - started)
            self._release(run, pending, path)

    def _unwritten(self, run: str, pending: _Pending, name: str) -> None:
        if self.book:
            self.book.unwritten(run, pending.rows, name)

    def _release(self, run: str, pending: _Pending, path: str) -> None:
        """The shard is durable: mark its samples done (one ledger call), then release their tasks."""
        self.storage.recovered()
        self._failed_runs.discard(run)
        metrics.SHARD_COMMITS.inc()
        metrics.SHARD_ROWS.inc(len(pending.rows))
        try:
            if self.book:
                self.book.mark_done(run, pending.rows, path)
        except Exception as exc:  # Redis gave up: the tasks fail, their redeliveries find the entries
            log.error("shard %s is durable but marking its %s done failed: %r",
                      path, counted(len(pending.rows), "sample"), exc)
            for future in pending.futures:
                future.set_exception(exc)
            return
        for future in pending.futures:
            future.set_result(path)

    def _hold(self, run: str, pending: _Pending, error: OSError) -> None:
        """Storage refused the group: keep it (with its tasks waiting) for a retry after
        a backoff; when closing, tell the tasks instead, so they give their prompts back."""
        self._failed_runs.add(run)
        metrics.STORAGE_FAILURES.inc()
        if self._closed:
            self.storage.failed(error)
            for future in pending.futures:
                future.set_exception(StorageUnavailable(f"storage failing at shutdown: {error}"))
            return
        with self._lock:  # the group is pending again before anyone can see storage as failing
            held = self._pending.setdefault(run, _Pending())
            held.rows[:0], held.futures[:0] = pending.rows, pending.futures
            held.oldest = min(pending.oldest, held.oldest) if held.oldest else pending.oldest
            self.storage.failed(error)
            self._retry_at = time.monotonic() + self.storage.retry_delay(self.retry_base, self.retry_max)

    def _probe(self) -> None:
        """Nothing pending while storage fails: try a small file (object) where it last failed."""
        try:
            for run in sorted(self._failed_runs) or [""]:
                self.store.probe(run)
        except OSError as exc:
            self.storage.failed(exc)
            with self._lock:
                self._retry_at = time.monotonic() + self.storage.retry_delay(self.retry_base, self.retry_max)
            return
        self._failed_runs.clear()
        self.storage.recovered()

    def _name(self) -> str:
        """A final shard name no other writer can make (the random part) and that says whose it is."""
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return f"part-{self.worker}-{os.getpid()}-{stamp}-{self._seq:06d}-{secrets.token_hex(6)}.parquet"

def _to_table(rows: list[Sample]) -> tuple[object | None, str]:
    """The rows' Arrow table, or None and why they do not fit the shard schema."""
    try:
        return samples_to_table(rows), ""
    except Exception as exc:  # Arrow's conversion errors (ArrowInvalid, TypeError, OverflowError)
        return None, f"it does not fit the shard schema: {exc!r}"


def _refuse(row: Sample, future: Future, why: str) -> None:
    log.warning("sample of prompt %s cannot be stored: %s", row.id, why)
    future.set_exception(BadSample(f"the shard writer refused its sample: {why}"))
