"""The export's files: batches rolled into Parquet files of a bounded size, each whole or absent.

Each file is written under a temporary name, a row group at a time (so no file
is ever whole in memory), fsynced and renamed: a reader of the export folder
never sees half a file. A shard exported whole is adopted instead of
rewritten (hard-linked, the shard being immutable, or copied across file
systems). Every file is listed with its rows and SHA-256 for the manifest.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from contract.storage.durable import fsync_path
from contract.storage.schema import SPLIT_STREAMS

GROUP_BYTES = 64 * 2**20  # a row group is written once this much is buffered


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


class RollingWriter:
    """Writes batches into files of at most `limit` rows each (None: one file), a row group
    at a time; each file is written under a temporary name, fsynced and renamed. A shard
    exported whole is adopted as a file of its own: hard-linked (no byte written, the shard
    being immutable), or copied where the export is on another file system."""

    def __init__(self, folder: Path, stem: str, limit: int | None, schema: pa.Schema):
        self.folder, self.stem, self.limit, self.schema = folder, stem, limit, schema
        self.pending: list[pa.RecordBatch] = []
        self.pending_bytes = 0
        self.in_file = 0
        self.writer: pq.ParquetWriter | None = None
        self.current = ""  # the name of the file being written
        self.files: list[dict] = []
        self.sequence = 0
        self.on_file: Callable[[Path], str] | None = None  # each finished file, to move elsewhere (a bucket)

    def write(self, batch: pa.RecordBatch) -> None:
        while batch.num_rows:
            take = batch.num_rows if self.limit is None else min(self.limit - self.in_file, batch.num_rows)
            part, batch = batch.slice(0, take), batch.slice(take)
            self.pending.append(part)
            self.pending_bytes += part.nbytes
            self.in_file += take
            if self.pending_bytes >= GROUP_BYTES:
                self._flush_group()
            if self.limit is not None and self.in_file >= self.limit:
                self._roll()

    def adopt(self, shard, rows: int) -> None:
        """`shard`: a file's path (linked, or copied), or an object's bytes read already (written)."""
        name = self._next_name()
        target = self.folder / name
        if not isinstance(shard, str):
            shard.seek(0)
            digest = _copy(shard, target)
        else:
            try:
                os.link(shard, target)
                digest = _sha256(target)
            except OSError:  # another file system, or one without hard links
                with open(shard, "rb") as reader:
                    digest = _copy(reader, target)
        self._finished(target, rows, digest)

    def close(self) -> list[dict]:
        if self.in_file or not self.files and self.limit is None:  # an index is written even if empty
            self._roll()
        return self.files

    def _next_name(self) -> str:
        name = f"{self.stem}.parquet" if self.limit is None else f"{self.stem}-{self.sequence:05d}.parquet"
        self.sequence += 1
        return name

    def _flush_group(self) -> None:
        if self.writer is None:
            self.current = self._next_name()
            # Dictionary pages for every column but the token ids, whose dictionary costs more
            # time to build than it saves in bytes: rewriting stays as fast as reading.
            # The log-probability floats byte-stream-split, as in a shard (`contract.storage.schema.write_options`).
            dictionary = [f.name for f in self.schema if f.name != "input_ids"]
            self.writer = pq.ParquetWriter(self.folder / f".tmp-{self.current}", self.schema, compression="zstd",
                                           use_dictionary=dictionary, use_byte_stream_split=list(SPLIT_STREAMS))
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending, schema=self.schema))
        self.pending, self.pending_bytes = [], 0

    def _roll(self) -> None:
        self._flush_group()
        self.writer.close()
        self.writer = None
        temporary = self.folder / f".tmp-{self.current}"
        fsync_path(temporary)
        temporary.replace(self.folder / self.current)
        final = self.folder / self.current
        self._finished(final, self.in_file, _sha256(final))
        self.in_file = 0

    def _finished(self, path: Path, rows: int, digest: str) -> None:
        name = self.on_file(path) if self.on_file else path.name
        self.files.append({"name": name, "rows": rows, "sha256": digest})


def _copy(reader, target: Path) -> str:
    """Copy what `reader` holds into a new file (fsynced), returning its SHA-256."""
    digest = hashlib.sha256()
    with open(target, "xb") as sink:
        while chunk := reader.read(4 * 2**20):
            digest.update(chunk)
            sink.write(chunk)
        sink.flush()
        os.fsync(sink.fileno())
    return digest.hexdigest()
