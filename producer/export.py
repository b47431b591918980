"""The finished dataset: each done id exactly once, with a manifest.

Invariants, and why they hold:
- **Each id once.** A redelivered prompt can be stored twice (its sample was
  durable, the worker died before the acknowledgement); export keeps the first
  copy in shard-name order.
- **Only what the ledger says is done.** A stored sample whose prompt was later
  dead-lettered (or is queued again) is left out: each shard's ids are looked up
  in the ledger with HMGET, in chunks, and the rows left out are counted by state
  in the manifest. Nothing holds the ledger in memory; the one set that grows
  with the run is the ids already exported (the dedup).
- **A reader of `DEST/*.parquet` sees one whole export, never two mixed.** The
  export is written into a fresh folder beside DEST (files and manifest each
  written to a temporary name, fsynced, renamed), then swapped with DEST in
  one step (Linux `renameat2(RENAME_EXCHANGE)`; elsewhere two renames, between
  which DEST is briefly absent, never mixed), and the previous export is
  deleted. Exporting again is how a growing run is refreshed, so replacing is
  the default; a DEST that holds anything but a previous export (a manifest and
  `part-*.parquet` files) is refused rather than replaced, so export never
  deletes a user's files.

It streams shard by shard, so the dataset never has to fit in memory.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from contract.deadletters import DeadLetters
from contract.durable import fsync_folder, fsync_path
from contract.ledger import Ledger
from contract.names import PromptState
from contract.schema import arrow_schema, shard_files
from contract.spec import RunSpec, check_run_name

MANIFEST = "manifest.json"
LEDGER_CHUNK = 1000  # ids per HMGET


class ExportRefused(Exception):
    """DEST holds something that is not a previous export: it is left alone."""


def export_run(spec: RunSpec, client: redis.Redis, output_dir: str, dest: Path,
               rows_per_file: int = 10_000,
               on_progress: Callable[[int], None] | None = None) -> dict:
    """Write the export into a fresh folder beside `dest`, then swap it into place."""
    check_run_name(spec.name)
    dest = Path(dest).resolve()  # a symlinked DEST: its target is replaced, the link stays
    check_replaceable(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.export-", dir=dest.parent))
    try:
        manifest = _write_export(spec, client, output_dir, staging, rows_per_file, on_progress)
        _swap_into_place(staging, dest)
    finally:  # after a swap, `staging` holds the previous export
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def check_replaceable(dest: Path) -> None:
    """DEST may be absent, empty, or a previous export; anything else is refused."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise ExportRefused(f"{dest} exists and is not a folder")
    names = sorted(p.name for p in dest.iterdir())
    if not names:
        return
    strangers = [n for n in names if n != MANIFEST and not _is_export_file(n)]
    if strangers or MANIFEST not in names or not _is_manifest(dest / MANIFEST):
        shown = ", ".join(strangers[:5] or names[:5])
        raise ExportRefused(f"{dest} holds files that are not a previous export ({shown}); "
                            f"export into an empty or new folder")


def _is_export_file(name: str) -> bool:
    return (name.startswith("part-") and name.endswith(".parquet")) or name.startswith(".tmp-")


def _is_manifest(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "run" in data and "files" in data


def _write_export(spec: RunSpec, client: redis.Redis, output_dir: str, folder: Path, rows_per_file: int,
                  on_progress: Callable[[int], None] | None) -> dict:
    sources = shard_files(output_dir, spec.name)
    writer = _RollingWriter(folder, rows_per_file)
    ledger = Ledger(client, spec.name)
    seen: set[str] = set()
    left_out: Counter[str] = Counter()
    read_rows = duplicates = 0
    for number, path in enumerate(sources, start=1):
        table = pq.read_table(path, schema=arrow_schema())
        read_rows += table.num_rows
        ids = table.column("id").to_pylist()
        keep = []
        for prompt_id, state in zip(ids, _states(ledger, ids)):
            if state != PromptState.DONE:
                left_out[state or "missing"] += 1
                keep.append(False)
            elif prompt_id in seen:  # the first copy of each id wins
                duplicates += 1
                keep.append(False)
            else:
                seen.add(prompt_id)
                keep.append(True)
        writer.write(table.filter(pa.array(keep, type=pa.bool_())))
        if on_progress:
            on_progress(number)
    files = writer.close()
    manifest = {
        "run": spec.name,
        "exported_at": time.time(),
        "rows": len(seen),
        "source_rows": read_rows,
        "duplicates_dropped": duplicates,
        "left_out": dict(sorted(left_out.items())),  # stored rows whose id is not done: dead, queued, missing
        "source_shards": len(sources),
        "dead_letters": DeadLetters(client, spec.name).stats(),
        "ledger": _ledger_counts(ledger),
        "files": files,
        "tokenizer": spec.tokenizer,
        "tokenizer_fingerprint": spec.tokenizer_fingerprint,
        "template_fingerprint": spec.template_fingerprint,
        "served_model": spec.served_model,
        "models": _distinct(folder, files, "model"),
        "sampling": spec.sampling,
        "run_spec": asdict(spec),
    }
    _write_atomically(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
    fsync_folder(folder)
    return manifest


def _ledger_counts(ledger: Ledger) -> dict[str, int]:
    """Prompts by state, as the ledger's transitions keep them (no scan of the run)."""
    tally = ledger.tally()
    if not tally.exact:  # a run enqueued by a version that kept no counts by state
        return ledger.counts()
    return {state: n for state, n in (("queued", tally.queued), ("done", tally.done), ("dead", tally.dead)) if n}


def _states(ledger: Ledger, ids: list[str]) -> list[str | None]:
    """Each id's ledger state, read with one HMGET per chunk."""
    states: list[str | None] = []
    for start in range(0, len(ids), LEDGER_CHUNK):
        states += ledger.states(ids[start:start + LEDGER_CHUNK])
    return states


def _distinct(folder: Path, files: list[dict], column: str) -> list:
    values: set = set()
    for f in files:
        values |= set(pc.unique(pq.read_table(folder / f["name"], columns=[column]).column(column)).to_pylist())
    return sorted(v for v in values if v is not None)


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".tmp-{path.name}")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def _swap_into_place(staging: Path, dest: Path) -> None:
    """Make `staging` be `dest` in one step; afterwards `staging` holds what `dest` held."""
    if not dest.exists():
        os.rename(staging, dest)  # atomic; also replaces an empty folder made meanwhile
    elif not _exchange(staging, dest):
        os.rename(dest, staging.with_name(staging.name + ".old"))
        os.rename(staging, dest)
        os.rename(staging.with_name(staging.name + ".old"), staging)
    fsync_folder(dest.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where
    the system or the filesystem cannot."""
    rename_exchange, at_fdcwd = 2, -100
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


class _RollingWriter:
    """Writes tables into files of at most `rows_per_file` rows each, each one written
    under a temporary name, fsynced and renamed."""

    def __init__(self, folder: Path, rows_per_file: int):
        self.folder, self.limit = folder, rows_per_file
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
        temporary = self.folder / f".tmp-{name}"
        pq.write_table(pa.concat_tables(self.buffer), temporary, compression="zstd")
        fsync_path(temporary)
        temporary.replace(self.folder / name)
        self.files.append({"name": name, "rows": self.buffered, "sha256": _sha256(self.folder / name)})
        self.buffer, self.buffered = [], 0
