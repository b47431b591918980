"""Parquet shards written by group commit.

A task hands its sample to the writer and waits; the writer gathers samples
until a shard is full or its oldest sample has waited `max_wait` seconds,
writes one Parquet file under a temporary name, fsyncs it, links it into
place and only then releases the waiting tasks, which are then acknowledged.
So an acknowledged prompt is always in a shard, and shards stay large.

Two workers never write the same file, even when their node names and pids
coincide (containers where every worker is pid 1): each name carries a random
component, the temporary file is created exclusively, and the final name is
made with a hard link, which fails rather than replace an existing file.
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
from pathlib import Path

import pyarrow.parquet as pq

from contract.schema import Sample, samples_to_table

from . import metrics

log = logging.getLogger(__name__)

@dataclass
class _Pending:
    rows: list[Sample] = field(default_factory=list)
    futures: list[Future] = field(default_factory=list)
    oldest: float = 0.0


class ShardWriter:
    """One per worker process; thread-safe."""

    def __init__(self, output_dir: str, worker: str, max_rows: int, max_wait: float):
        self.root = Path(output_dir)
        self.worker = re.sub(r"[^A-Za-z0-9_.-]+", "-", worker).strip("-.") or "worker"
        self.max_rows, self.max_wait = max_rows, max_wait
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Condition()
        self._seq = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fleet-shards", daemon=True)
        self._thread.start()

    def submit(self, run: str, row: Sample) -> Future:
        """Queue one sample; the future resolves to its shard path once durable."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("shard writer is closed")
            pending = self._pending.setdefault(run, _Pending())
            if not pending.rows:
                pending.oldest = time.monotonic()
            pending.rows.append(row)
            pending.futures.append(future)
            if len(pending.rows) >= self.max_rows:
                self._lock.notify()
        return future

    def close(self) -> None:
        """Write what is pending and stop."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._take_due()
                while not due and not self._closed:
                    self._lock.wait(self._sleep_time())
                    due = self._take_due()
                if self._closed:
                    due += [(r, p) for r, p in self._pending.items() if p.rows]
                    self._pending.clear()
            for run, pending in due:
                self._commit(run, pending)
            if self._closed and not due:
                return

    def _take_due(self) -> list[tuple[str, _Pending]]:
        now = time.monotonic()
        due = [(run, p) for run, p in self._pending.items()
               if p.rows and (len(p.rows) >= self.max_rows or now - p.oldest >= self.max_wait)]
        for run, _ in due:
            del self._pending[run]
        return due

    def _sleep_time(self) -> float:
        if not self._pending:
            return self.max_wait
        oldest = min(p.oldest for p in self._pending.values() if p.rows)
        return max(0.01, self.max_wait - (time.monotonic() - oldest))

    def _commit(self, run: str, pending: _Pending) -> None:
        try:
            path = self._write(run, pending.rows)
        except BaseException as exc:  # the tasks must learn their sample is not durable
            log.exception("shard write failed for %d samples of run %s", len(pending.rows), run)
            for future in pending.futures:
                future.set_exception(exc)
            return
        metrics.SHARD_COMMITS.inc()
        metrics.SHARD_ROWS.inc(len(pending.rows))
        for future in pending.futures:
            future.set_result(str(path))

    def _write(self, run: str, rows: list[Sample]) -> Path:
        folder = self.root / run
        folder.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"part-{self.worker}-{os.getpid()}-{stamp}-{self._seq:06d}-{secrets.token_hex(6)}.parquet"
        final, temporary = folder / name, folder / f".tmp-{name}"
        table = samples_to_table(rows)
        with open(temporary, "xb") as sink:  # exclusive: never another writer's file
            pq.write_table(table, sink, compression="zstd")
            sink.flush()
            os.fsync(sink.fileno())
        _publish(temporary, final)
        _fsync_dir(folder)
        return final


def _publish(temporary: Path, final: Path) -> None:
    """Give the file its final name without ever replacing one (a link fails if it exists)."""
    try:
        os.link(temporary, final)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: the random name keeps it unique
        if final.exists():
            raise FileExistsError(final)
        os.rename(temporary, final)
        return
    os.unlink(temporary)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
