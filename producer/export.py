"""The finished dataset: each done id exactly once, with a manifest.

Invariants, and why they hold:
- **Each id once, and only what the ledger says is done.** When a worker marks
  a prompt done, the ledger records which shard holds its canonical copy
  (`shard_code` of the shard's file name). A stored row is exported iff its
  prompt is done AND the row sits in that shard: a redelivered prompt stored
  twice, or a sample whose prompt was dead-lettered or queued again since, is
  left out and counted in the manifest (`duplicates_dropped`, `left_out`). A
  batch of rows costs one script call that reads their entries; nothing holds
  a set of the run's ids (only the ids of the one shard being read, to drop a
  row written twice into the same shard).
- **As fast as reading the shards.** The ledger counts, per shard, the
  prompts whose canonical copy it holds (`Ledger.canonical_rows`): a shard
  with that many rows holds only canonical rows, and (when it fits in a file)
  is exported whole, hard-linked into the export (copied across file
  systems), its footer alone read. Only a shard with rows to leave out is
  read, a batch at a time, one script call per batch looking up its ids, and
  its kept rows are written out a row group at a time (ParquetWriter), so no
  file is ever whole in memory. `jobs` processes each export an interleaved
  share of the shards into their own files (`part-<job>-<n>.parquet`).
- **Each sample once, in a run of several samples a prompt.** A row's ledger
  key is derived from its `id` and `sample` (`contract/run/samples.py`'s
  `row_key`), so the rule above holds per sample: every (`id`, `sample`) done
  is exported once. The manifest counts the samples (`rows`) and the run's
  prompts (`prompts`, as enqueued; `samples_per_prompt`).
- **Readers of the shards in place** (`index_only`): `keep-<job>.parquet`
  lists (shard file name, row number in the shard, id) of every canonical row,
  read from the shards' `id` column alone; a distributed reader (DuckDB,
  Spark) semi-joins the shards with it instead of copying the dataset.
- **A reader of `DEST/*.parquet` sees one whole export, never two mixed**:
  the export is written into a fresh folder beside DEST and swapped into
  place (`export_folder.py`, which also refuses a DEST that is not a
  previous export).
- **DEST may be a bucket** (`s3://bucket/dest`, `export_bucket.py`): the same
  selection, each file uploaded as soon as it is finished, the manifest written
  last, which is what readers open. The shards themselves are read wherever
  `OUTPUT_DIR` keeps them (`contract/storage`), one at a time.
- **Every format holds the same rows.** `--format specforge|speculators|text`
  is written (`producer/formats/`) from a Parquet export made inside the fresh
  folder and removed before the swap, so the selection above is the one code
  path; the manifest's `format` entry (rows, id-set digest, token counts) is
  computed the same way for every format, Parquet included.
- **Only what passed** (`verified_only`, `export --verified-only`): of the rows
  above, those whose `verified` is true; the others (failed, an `error`
  verdict, or never checked) are counted in the manifest's `left_out` by
  verdict class (`verdict:fail`, `verdict:error`, `verdict:none`). Every shard
  is then read row by row (a shard's footer does not say all its rows passed).
- **A dataset card beside the data** (`README.md`, `producer/card.py`): the
  servers' SGLang and weight versions, the model, tokenizer and template
  fingerprints, sampling and seeds, the verifier, the counts, dead letters by
  reason and verdicts, from the run's spec, counters and provenance hash
  (none of them growing with the run); written before the swap (a folder) or
  before the manifest (a bucket), so a reader that sees an export sees its card.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import redis

from contract.ledger.ledger import Entry, Ledger, shard_code
from contract.names import PromptState
from contract.fleet.provenance import read_provenance, summary as provenance_summary
from contract.run.samples import row_key
from contract.storage.schema import arrow_schema
from contract.storage.shard_home import check_found
from contract.run.spec import RunSpec, check_run_name
from contract.storage import store_for
from contract.run.verifiers import verdict_class

from . import formats
from .export_bucket import Uploader, is_bucket, previous_parts, publish
from .card import CARD, render_card, verdicts
from .export_folder import (ExportRefused, check_replaceable, staging_beside, swap_into_place, write_atomically,
                            write_manifest)
from .export_writer import RollingWriter

BATCH_ROWS = 2048           # rows read (and looked up in the ledger) at a time
JOB_BYTES = 2**30           # jobs=0: a process per this much of shards (a process costs ~1 s to start)
VERDICT_LEFT_OUT = "verdict:"  # `left_out` keys of done samples `--verified-only` leaves out, by verdict class
KEEP_SCHEMA = pa.schema([("shard", pa.string()), ("row", pa.int64()), ("id", pa.string())])


def export_run(spec: RunSpec, client: redis.Redis, output_dir: str, dest: Path | str,
               rows_per_file: int = 10_000, on_progress: Callable[[int], None] | None = None,
               jobs: int = 1, redis_url: str | None = None, index_only: bool = False,
               format: str = formats.PARQUET, format_options: dict | None = None,
               complete_only: bool = False, verified_only: bool = False) -> dict:
    """Write the export into a fresh folder beside `dest`, then swap it into place. With
    `jobs` > 1 (and `redis_url`, for the other processes) the shards are shared out; 0:
    a process per `JOB_BYTES` of shards, at most one per core (and 8). A `format` other
    than Parquet is written from a Parquet export made inside the fresh folder, then
    removed, so every format holds the same rows (`producer/formats/`)."""
    check_run_name(spec.name)
    if format not in formats.NAMES or (index_only and format != formats.PARQUET):
        raise ValueError(f"format {format!r} is not one of {formats.NAMES}, or comes with --index-only")
    if is_bucket(str(dest)):
        return _export_to_bucket(spec, client, output_dir, str(dest), rows_per_file, on_progress, index_only,
                                 format, complete_only, verified_only)
    dest = Path(dest).resolve()  # a symlinked DEST: its target is replaced, the link stays
    check_replaceable(dest)
    staging = staging_beside(dest)  # DEST once swapped: the umask's mode
    try:
        rows = staging if format == formats.PARQUET else staging / ".rows"
        rows.mkdir(exist_ok=True)
        manifest = _write_export(spec, client, output_dir, rows, rows_per_file, on_progress,
                                 jobs, redis_url, index_only, complete_only, verified_only=verified_only)
        if not index_only:
            manifest = _add_format(manifest, spec, rows, staging, format, format_options or {})
        write_atomically(staging / CARD, _card(spec, client, manifest).encode())
        swap_into_place(staging, dest)
    finally:  # after a swap, `staging` holds the previous export
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _export_to_bucket(spec: RunSpec, client: redis.Redis, output_dir: str, dest: str, rows_per_file: int,
                      on_progress: Callable[[int], None] | None, index_only: bool, format: str,
                      complete_only: bool, verified_only: bool = False) -> dict:
    """The export at `s3://bucket/dest` (`export_bucket.py`): each part uploaded as it is
    written, the manifest last; the previous export's parts deleted after."""
    if format != formats.PARQUET:
        raise ExportRefused(f"--format {format} is written to a folder; export to a folder, then copy it")
    previous = previous_parts(dest)
    uploader = Uploader(dest, count=not index_only)
    staging = Path(tempfile.mkdtemp(prefix=".export-"))  # private scratch, uploaded and removed
    try:
        manifest = _write_export(spec, client, output_dir, staging, rows_per_file, on_progress, 1, None,
                                 index_only, complete_only, on_file=uploader, verified_only=verified_only)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    manifest["export_id"] = uploader.export_id
    if not index_only:
        manifest["format"] = {"name": formats.PARQUET, **uploader.figures.to_dict()}
    publish(dest, manifest, previous, card=_card(spec, client, manifest))
    return manifest


def _card(spec: RunSpec, client: redis.Redis, manifest: dict) -> str:
    """The dataset card (`producer/card.py`) of an export whose manifest is `manifest`."""
    return render_card(spec, manifest, read_provenance(client, spec.name), Ledger(client, spec.name).counters())


def _add_format(manifest: dict, spec: RunSpec, rows: Path, folder: Path, format: str, options: dict) -> dict:
    """The manifest with the format's entry (its files, rows, id digest, token counts); a
    format other than Parquet is written from the Parquet files in `rows`, which go."""
    parquet = [rows / f["name"] for f in manifest["files"]]
    if format == formats.PARQUET:
        manifest["format"] = formats.parquet_figures(parquet)
    else:
        manifest["format"] = formats.write_format(format, spec, parquet, folder, options)
        manifest["files"] = manifest["format"].pop("files")
        shutil.rmtree(rows)
    write_manifest(folder, manifest)
    return manifest


@dataclass
class _Share:
    """One process's share of an export, and what it found."""
    number: int
    run: str
    shards: list[str]
    folder: str
    rows_per_file: int
    index_only: bool
    output_dir: str = ""  # where the shards are (`contract/storage`)
    redis_url: str | None = None
    files: list[dict] = field(default_factory=list)
    rows: int = 0
    source_rows: int = 0
    duplicates: int = 0
    left_out: Counter = field(default_factory=Counter)
    models: set = field(default_factory=set)
    complete_only: bool = False  # only the turns of complete conversations (`--complete-only`)
    # `--complete-only`: each conversation judged once, when its first turn is read, and held to that
    # for the rest of the export (judged again per shard, a conversation that completed between two
    # shards' reads lost its early turns and kept its later ones)
    judged: dict = field(default_factory=dict)
    # `--complete-only`: the conversations in progress when the export listed the shards, never whole in
    # it: one that completes after the listing has its last turn in a shard the listing did not see.
    # The same for every process of the export (each judges its conversations at its own time)
    in_progress: frozenset = frozenset()
    verified_only: bool = False  # only the samples the run's verifier passed (`--verified-only`)
    samples: int = 1     # the run's samples a prompt: a row's ledger key is `row_key(id, sample, samples)`
    whole: int = 0       # shards exported as they are
    rewritten: int = 0   # shards read row by row (some rows left out, or too many for a file)


def _write_export(spec: RunSpec, client: redis.Redis, output_dir: str, folder: Path, rows_per_file: int,
                  on_progress: Callable[[int], None] | None, jobs: int, redis_url: str | None,
                  index_only: bool, complete_only: bool = False,
                  on_file: Callable[[Path], str] | None = None, verified_only: bool = False) -> dict:
    store = store_for(output_dir)
    done_before = Ledger(client, spec.name).tally().done  # each of these has its shard by now
    in_progress = _conversations_in_progress(client, spec.name) if complete_only else frozenset()
    sizes = store.sizes(spec.name)
    sources = list(sizes)
    if not jobs:
        jobs = min(os.cpu_count() or 1, 8, sum(sizes.values()) // JOB_BYTES)
    jobs = max(1, min(jobs if redis_url else 1, len(sources)))
    shares = [_Share(n, spec.name, sources[n::jobs], str(folder), rows_per_file, index_only, output_dir, redis_url,
                     complete_only=complete_only, in_progress=in_progress, verified_only=verified_only,
                     samples=spec.samples)
                for n in range(jobs)]
    if jobs == 1:
        shares = [_export_share(shares[0], client, on_progress, on_file)]
    else:
        shares = _in_processes(shares, on_progress)
    files = sorted((f for s in shares for f in s.files), key=lambda f: f["name"])
    tally = Ledger(client, spec.name).tally()
    rows = sum(s.rows for s in shares)
    left_out = sum((s.left_out for s in shares), Counter())
    # every prompt done before the export began is exported, or left out as part of an
    # incomplete conversation; fewer: the shards were read in the wrong place, or some are gone
    # or left out by its verdict (`--verified-only`)
    judged = sum(n for k, n in left_out.items() if k.startswith(VERDICT_LEFT_OUT))
    check_found(spec.name, done_before, rows + left_out["incomplete_conversation"] + judged, store.where(spec.name))
    manifest = {
        "run": spec.name,
        "exported_at": time.time(),
        "rows": rows,  # samples exported (one row each)
        # the run's prompts as enqueued (of several samples each where samples_per_prompt > 1)
        "prompts": tally.enqueued if spec.samples == 1 or tally.prompts is None else tally.prompts,
        "samples_per_prompt": spec.samples,
        "source_rows": sum(s.source_rows for s in shares),
        "duplicates_dropped": sum(s.duplicates for s in shares),
        # stored rows whose id is not done: dead, queued, missing
        "left_out": dict(sorted(left_out.items())),
        # done prompts with no row exported: their canonical shard is gone, or they were
        # stored while the export ran
        "done_not_exported": max(0, tally.done - rows),
        "source_shards": len(sources),
        "shards_whole": sum(s.whole for s in shares),
        "shards_rewritten": sum(s.rewritten for s in shares),
        "source": store.where(spec.name),
        "index_only": index_only,
        "complete_only": complete_only,
        "verified_only": verified_only,
        "dead_letters": dict(tally.reasons),
        "ledger": tally.by_state(),
        "files": files,
        "tokenizer": spec.tokenizer,
        "tokenizer_fingerprint": spec.tokenizer_fingerprint,
        "template_fingerprint": spec.template_fingerprint,
        "served_model": spec.served_model,
        "models": sorted(set().union(*(s.models for s in shares))),
        "sampling": spec.sampling,
        # what made the samples: each server's SGLang version, model and weight versions (contract/fleet/provenance.py)
        "provenance": provenance_summary(read_provenance(client, spec.name)),
        "verdicts": verdicts(Ledger(client, spec.name).counters()),
        "run_spec": asdict(spec),
    }
    write_manifest(folder, manifest)
    return manifest


def _in_processes(shares: list[_Share], on_progress: Callable[[int], None] | None) -> list[_Share]:
    """Each share in its own process (spawned: the parent may hold threads and connections)."""
    context = multiprocessing.get_context("spawn")
    done = context.Value("i", 0)
    with ProcessPoolExecutor(len(shares), mp_context=context, initializer=_child_init,
                             initargs=(done,)) as pool:
        futures = [pool.submit(_export_share, share) for share in shares]
        while not all(f.done() for f in futures):
            time.sleep(0.2)
            if on_progress:
                on_progress(done.value)
        results = [f.result() for f in futures]
    if on_progress:
        on_progress(done.value)
    return results


_shards_done = None  # in a child: the shared count of shards exported


def _child_init(counter) -> None:
    global _shards_done
    _shards_done = counter


def _export_share(share: _Share, client: redis.Redis | None = None,
                  on_progress: Callable[[int], None] | None = None,
                  on_file: Callable[[Path], str] | None = None) -> _Share:
    if client is None:
        from contract.redis_link.connections import redis_for

        client = redis_for(share.redis_url)
    ledger = Ledger(client, share.run)
    folder = Path(share.folder)
    writer = (RollingWriter(folder, f"keep-{share.number:03d}", None, KEEP_SCHEMA) if share.index_only
              else RollingWriter(folder, f"part-{share.number:03d}", share.rows_per_file, arrow_schema()))
    writer.on_file = on_file
    store = store_for(share.output_dir)
    for number, location in enumerate(share.shards, start=1):
        _export_shard(location, store.source(location), ledger, writer, share)
        if _shards_done is not None:
            with _shards_done.get_lock():
                _shards_done.value += 1
        if on_progress:
            on_progress(number)
    share.files = writer.close()
    return share


def _export_shard(path: str, source, ledger: Ledger, writer: "RollingWriter", share: _Share) -> None:
    """The shard's canonical rows to `writer`: the whole shard as it is when the ledger says
    every row of it is canonical (the usual case), else a batch at a time. `source` is what
    pyarrow reads (`Store.source`: the file, or the object's bytes)."""
    shard = pq.ParquetFile(source)
    name = PurePosixPath(path).name
    rows = shard.metadata.num_rows
    whole = (rows and shard.schema_arrow.equals(arrow_schema())
             and (share.index_only or rows <= share.rows_per_file) and ledger.canonical_rows(path) == rows
             and not share.complete_only and not share.verified_only)
    if whole:
        share.whole += 1
        share.source_rows += rows
        share.rows += rows
        if share.index_only:
            ids = shard.read(columns=["id"]).column("id")
            writer.write(pa.record_batch([pa.repeat(pa.scalar(name), rows), pa.array(range(rows), pa.int64()),
                                          ids.combine_chunks()], schema=KEEP_SCHEMA))
        else:
            share.models.update(_models(shard))
            writer.adopt(source, rows)
        return
    share.rewritten += 1
    _export_rows(name, source, ledger, writer, share)


def _models(shard: pq.ParquetFile) -> set[str]:
    """The `model` values of a shard, from its footer's statistics when they tell."""
    index = shard.schema_arrow.get_field_index("model")
    found: set[str] = set()
    for group in range(shard.metadata.num_row_groups):
        stats = shard.metadata.row_group(group).column(index).statistics
        if stats is not None and stats.has_min_max and stats.min == stats.max:
            found.add(stats.min)
        elif stats is None or stats.null_count != stats.num_values:
            column = shard.read_row_group(group, columns=["model"]).column("model")
            found.update(m for m in pc.unique(column).to_pylist() if m is not None)
    return found


def _export_rows(name: str, source, ledger: Ledger, writer: "RollingWriter", share: _Share) -> None:
    """The shard's rows a batch at a time, each kept iff the ledger says its prompt is done
    with its canonical copy in this shard."""
    canonical = b"%d" % shard_code(name)  # the stored state of a prompt done in this shard
    columns = (["id"] + ["sample"] * (share.samples > 1) + ["verified", "verdict"] * share.verified_only
               if share.index_only else None)
    dataset = _dataset(source)
    seen: set[str] = set()  # this shard's ids: a row written twice into one shard counts once
    offset = 0  # the batch's first row number in the shard
    for batch in dataset.to_batches(columns=columns, batch_size=BATCH_ROWS, batch_readahead=1):
        ids = batch.column("id").to_pylist()
        if share.samples > 1:  # each row's ledger key: a sample's `<id>~<index>`
            ids = [row_key(i, n, share.samples) for i, n in zip(ids, batch.column("sample").to_pylist())]
        share.source_rows += len(ids)
        keep = [_keep(prompt_id, raw, canonical, seen, share) for prompt_id, raw in zip(ids, ledger.raw_entries(ids))]
        if share.complete_only:
            keep = _of_complete_conversations(ledger, ids, keep, share)
        if share.verified_only:
            keep = _verified(batch, keep, share)
        keep = pa.array(keep, type=pa.bool_())
        kept = batch.filter(keep)
        share.rows += kept.num_rows
        if share.index_only:
            rows = pc.filter(pa.array(range(offset, offset + len(ids)), pa.int64()), keep)
            kept = pa.record_batch([pa.array([name] * kept.num_rows, pa.string()), rows, kept.column("id")],
                                   schema=KEEP_SCHEMA)
        elif kept.num_rows:
            share.models.update(m for m in pc.unique(kept.column("model")).to_pylist() if m is not None)
        writer.write(kept)
        offset += len(ids)


def _dataset(source) -> pads.Dataset:
    """One shard as a dataset with the shard schema (so an older file's missing columns read
    as nulls): from its path, or from an object's bytes already read."""
    if isinstance(source, str):
        return pads.dataset(source, format="parquet", schema=arrow_schema())
    source.seek(0)
    parquet = pads.ParquetFileFormat()
    return pads.FileSystemDataset([parquet.make_fragment(source)], schema=arrow_schema(), format=parquet)


def _conversations_in_progress(client: redis.Redis, run: str) -> frozenset:
    """The run's conversations in progress now, read before the shards are listed (`_Share.in_progress`)."""
    from contract.ledger.conversation_ledger import ConversationLedger

    return frozenset(conversation for conversation, _ in ConversationLedger(client, run).positions())


def _of_complete_conversations(ledger: Ledger, ids: list[str], keep: list[bool], share: _Share) -> list[bool]:
    """`--complete-only`: a kept turn stays only if its conversation has every turn stored
    (the others are counted in `left_out` as `incomplete_conversation`)."""
    from contract.ledger.conversation_ledger import ConversationLedger
    from contract.chat.conversations import SEPARATOR, split_turn_id

    conversations = [split_turn_id(i)[0] if SEPARATOR in i else i for i in ids]
    unjudged = list(dict.fromkeys(c for c in conversations if c not in share.judged))
    complete_now = ConversationLedger(ledger.client, ledger.run).complete(unjudged)
    share.judged.update((c, whole and c not in share.in_progress) for c, whole in zip(unjudged, complete_now))
    complete = [share.judged[c] for c in conversations]
    out = []
    for kept, whole in zip(keep, complete):
        if kept and not whole:
            share.left_out["incomplete_conversation"] += 1
        out.append(kept and whole)
    return out


def _verified(batch: pa.RecordBatch, keep: list[bool], share: _Share) -> list[bool]:
    """`--verified-only`: a kept sample stays only if the run's verifier passed it (the others are
    counted in `left_out` by verdict class: `verdict:fail`, `verdict:error`, `verdict:none` where
    it was never checked)."""
    verified, verdicts = batch.column("verified").to_pylist(), batch.column("verdict").to_pylist()
    out = []
    for kept, passed, verdict in zip(keep, verified, verdicts):
        if kept and passed is not True:
            share.left_out[VERDICT_LEFT_OUT + (verdict_class(passed, verdict) or "none")] += 1
        out.append(kept and passed is True)
    return out


def _keep(prompt_id: str, raw: bytes | None, canonical: bytes, seen: set[str], share: _Share) -> bool:
    if raw == canonical and prompt_id not in seen:
        seen.add(prompt_id)
        return True
    state = Entry.decode(raw).state
    if state == PromptState.DONE:  # another copy is the canonical one
        share.duplicates += 1
    else:
        share.left_out[state or "missing"] += 1
    return False
