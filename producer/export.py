"""The finished dataset: each stored id exactly once, with a manifest.

A redelivered prompt can be stored twice (its sample was durable, the worker
died before the acknowledgement); export keeps the first copy. It streams shard
by shard, so the dataset never has to fit in memory.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from contract.deadletters import DeadLetters
from contract.ledger import Ledger
from contract.schema import arrow_schema, shard_files
from contract.spec import RunSpec


def export_run(spec: RunSpec, client: redis.Redis, output_dir: str, dest: Path,
               rows_per_file: int = 10_000,
               on_progress: Callable[[int], None] | None = None) -> dict:
    dest.mkdir(parents=True, exist_ok=True)
    sources = shard_files(output_dir, spec.name)
    writer = _RollingWriter(dest, rows_per_file)
    seen: set[str] = set()
    read_rows = 0
    for number, path in enumerate(sources, start=1):
        table = pq.read_table(path, schema=arrow_schema())
        read_rows += table.num_rows
        ids = table.column("id").to_pylist()
        keep = [i not in seen and not seen.add(i) for i in ids]  # first copy of each id wins
        writer.write(table.filter(pa.array(keep)))
        if on_progress:
            on_progress(number)
    files = writer.close()
    manifest = {
        "run": spec.name,
        "exported_at": time.time(),
        "rows": len(seen),
        "duplicates_dropped": read_rows - len(seen),
        "source_shards": len(sources),
        "dead_letters": DeadLetters(client, spec.name).stats(),
        "ledger": Ledger(client, spec.name).counts(),
        "files": files,
        "tokenizer": spec.tokenizer,
        "tokenizer_fingerprint": spec.tokenizer_fingerprint,
        "template_fingerprint": spec.template_fingerprint,
        "served_model": spec.served_model,
        "models": _distinct(dest, files, "model"),
        "sampling": spec.sampling,
        "run_spec": asdict(spec),
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def _distinct(dest: Path, files: list[dict], column: str) -> list:
    values: set = set()
    for f in files:
        values |= set(pc.unique(pq.read_table(dest / f["name"], columns=[column]).column(column)).to_pylist())
    return sorted(v for v in values if v is not None)


class _RollingWriter:
    """Writes tables into files of at most `rows_per_file` rows each."""

    def __init__(self, dest: Path, rows_per_file: int):
        self.dest, self.limit = dest, rows_per_file
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.files: list[dict] = []

    def write(self, table: pa.Table) -> None:
        while table.num_rows:
            take = min(self.limit - self.buffered, table.num_rows)
            self.buffer.append(table.slice(0, take))
            self.buffered += take
            table = table.slice(take)
            if self.buffered >= self.limit:
                self._flush()

    def close(self) -> list[dict]:
        if self.buffered:
            self._flush()
        return self.files

    def _flush(self) -> None:
        name = f"part-{len(self.files):05d}.parquet"
        temporary = self.dest / f".tmp-{name}"
        pq.write_table(pa.concat_tables(self.buffer), temporary, compression="zstd")
        temporary.replace(self.dest / name)
        digest = hashlib.sha256((self.dest / name).read_bytes()).hexdigest()
        self.files.append({"name": name, "rows": self.buffered, "sha256": digest})
        self.buffer, self.buffered = [], 0
