"""The export's formats: `parquet` (the shards' own rows, the default) and one module per other format.

A format module names its one file (`FILE`) and makes one JSON line of each row
(`line_maker(spec, options)`). `write_format` streams the rows of a Parquet
export (the export's selection: each done id once, see `producer/export.py`)
through it into `folder/FILE`, written under a temporary name, fsynced and
renamed, and returns the file's manifest entry with the format's figures
(`figures.py`): the row count, the id-set digest and the token counts, so a
reader can check one format's rows against another's. The export then swaps
the folder into place, as it does for Parquet.
"""
from __future__ import annotations

import hashlib
import os
from importlib import import_module
from pathlib import Path

import pyarrow.parquet as pq

from contract.run.spec import RunSpec

from .figures import Figures
from .rows import read_rows

PARQUET = "parquet"
MODULES = {"specforge": "specforge", "speculators": "speculators", "text": "text"}
NAMES = (PARQUET, *MODULES)
FILES = {"specforge.jsonl", "speculators.jsonl", "messages.jsonl"}  # what an earlier export may hold



class FormatRefused(Exception):
    """A format cannot be written faithfully (the run's tokenizer differs, an input file is unreadable)."""


def write_format(name: str, spec: RunSpec, parquet_files: list[Path], folder: Path, options: dict) -> dict:
    """Write format `name` of the rows in `parquet_files` into `folder`; its manifest entry."""
    module = import_module(f"{__name__}.{MODULES[name]}")
    make_line = module.line_maker(spec, options)
    figures = Figures()
    target = folder / module.FILE
    temporary = folder / f".tmp-{module.FILE}"
    digest = hashlib.sha256()
    with open(temporary, "wb") as sink:
        for row in read_rows(parquet_files):
            data = (make_line(row) + "\n").encode("utf-8", "surrogatepass")
            digest.update(data)
            sink.write(data)
            figures.add(row)
        sink.flush()
        os.fsync(sink.fileno())
    temporary.replace(target)
    return {"name": name, "files": [{"name": module.FILE, "rows": figures.rows, "sha256": digest.hexdigest()}],
            **figures.to_dict()}


def parquet_figures(parquet_files: list[Path]) -> dict:
    """The Parquet export's figures, from its small columns alone (the token ids are not read)."""
    figures = Figures()
    for path in parquet_files:
        count_parquet(figures, path)
    return {"name": PARQUET, **figures.to_dict()}


def count_parquet(figures: Figures, path: Path) -> None:
    """One Parquet file's rows into `figures` (an export to a bucket counts each part before it goes)."""
    shard = pq.ParquetFile(path)
    columns = [c for c in ("id", "prompt_len", "output_len", "conversation") if c in shard.schema_arrow.names]
    for batch in shard.iter_batches(batch_size=65536, columns=columns):
        figures.add_columns(batch.column("id").to_pylist(), batch.column("prompt_len"),
                            batch.column("output_len"),
                            batch.column("conversation") if "conversation" in columns else None)
