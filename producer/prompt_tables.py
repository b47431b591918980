"""Reading prompts from tables: a Parquet file, or a Hugging Face `datasets` folder.

`enqueue` takes, besides a JSONL file, a `.parquet` file or a folder that
`datasets.Dataset.save_to_disk` wrote (`state.json`, `dataset_info.json` and
`data-0000i-of-0000N.arrow` files, each an Arrow IPC *stream*, in the order
`state.json`'s `_data_files` lists them). Each row becomes the record a JSONL
line's object would be (`row.to_pylist()`: lists, structs as dicts) and goes
through the same `prompts.parse_record`, so a row is accepted, refused, given
an id, and carries its other columns (an `answer`, say) exactly as a line
with those fields would. A refused row is a `BadLine` whose number is the
row's index in the table, from 0 (what `dataset[i]` and `pandas.iloc` name),
and the summary says "row", not "line".

Why no `datasets` dependency: the folder's layout is plain Arrow, and pyarrow
(already needed for the shards) reads it; the `datasets` library would pull in
a large tree for a producer that only reads.

Streaming, so memory is flat in the table's size: Parquet is read `BATCH`
rows at a time (`ParquetFile.iter_batches`: at most a row group's pages are
decoded at once), and an Arrow file is memory-mapped and read one record batch
at a time (`datasets` writes batches of 1,000 rows by default); only the
current batch's rows are ever Python objects. A whole-table fault (no such
column, a folder that is a `DatasetDict`, a file pyarrow cannot open) is a
`TableRefused`, said before any prompt is published.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Iterator

from .prompts import FORMS, BadLine, Columns, InvalidPrompt, Prompt, mentions_line_fields, parse_record

BATCH = 256          # rows turned into Python objects at a time
STATE = "state.json"
INFO = "dataset_info.json"
SPLITS = "dataset_dict.json"


class TableRefused(ValueError):
    """The table as a whole cannot be read as prompts (the message says why and what to pass)."""


def is_table(path: Path) -> bool:
    """Whether `path` names a Parquet file or a `datasets` folder rather than a JSONL file."""
    path = Path(path)
    if path.is_dir():
        return True
    return path.suffix.lower() == ".parquet"


def may_carry_sampling(path: Path) -> bool:
    """Whether some prompt of the input may carry its own `sampling` (`RunSpec.line_fields`): a table
    where it has the column, a JSONL file where the key's bytes occur (`mentions_line_fields`)."""
    if not is_table(path):
        return mentions_line_fields(path)
    try:
        return "sampling" in TableSource(path).names
    except TableRefused:
        return False  # refused, with its reason, when it is read


class TableSource:
    """The rows of one table as prompts, with how far the reading has got (in bytes of `size`)."""

    def __init__(self, path: Path, columns: Columns = Columns(), batch: int = BATCH):
        self.path, self.columns, self.batch = Path(path), columns, batch
        self.position = 0
        if self.path.is_dir():
            self.kind, self.files = "datasets folder", _arrow_files(self.path)
        else:
            self.kind, self.files = "Parquet file", [self.path]
        self.size = sum(f.stat().st_size for f in self.files)
        self.names = self._column_names()
        _check_columns(self.path, self.names, columns)

    def _column_names(self) -> list[str]:
        if not self.files:
            return []
        try:
            if self.kind == "Parquet file":
                import pyarrow.parquet as pq

                return list(pq.read_schema(self.files[0]).names)
            return list(_open_arrow(self.files[0]).schema.names)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise TableRefused(f"{self.files[0]} is not a readable {self.kind}: {exc}"[:500]) from None

    def __iter__(self) -> Iterator[Prompt | BadLine]:
        number = 0
        for batch in self._batches():
            for row in batch.to_pylist():
                yield _row_prompt(row, number, self.columns)
                number += 1

    def _batches(self):
        if self.kind == "Parquet file":
            import pyarrow.parquet as pq

            with pq.ParquetFile(self.path) as table:
                total, done = max(1, table.metadata.num_rows), 0
                for batch in table.iter_batches(batch_size=self.batch):
                    done += batch.num_rows
                    self.position = self.size * done // total
                    yield batch
            return
        before = 0
        for path in self.files:
            reader = _open_arrow(path)
            for batch in reader:
                for start in range(0, batch.num_rows, self.batch):
                    yield batch.slice(start, self.batch)
                self.position = before + reader.source.tell()
            before += path.stat().st_size
            self.position = before


class _Batches:
    """An Arrow file's record batches, read from a memory map (stream or file format)."""

    def __init__(self, path: Path):
        import pyarrow as pa

        self.source = pa.memory_map(str(path))
        try:
            self.reader = pa.ipc.open_stream(self.source)
            self.stream = True
        except pa.ArrowInvalid:
            self.source.seek(0)
            self.reader = pa.ipc.open_file(self.source)
            self.stream = False
        self.schema = self.reader.schema

    def __iter__(self):
        if self.stream:
            yield from self.reader
        else:
            for i in range(self.reader.num_record_batches):
                yield self.reader.get_batch(i)


def _open_arrow(path: Path) -> _Batches:
    return _Batches(path)


def _arrow_files(folder: Path) -> list[Path]:
    """The data files of a `save_to_disk` folder, in the dataset's order."""
    if (folder / SPLITS).exists():
        try:
            splits = json.loads((folder / SPLITS).read_text()).get("splits") or []
        except (OSError, ValueError, AttributeError):
            splits = []
        shown = ", ".join(map(str, splits)) or "its splits"
        raise TableRefused(f"{folder} is a DatasetDict ({shown}): pass one split's folder, e.g. "
                           f"{folder / (str(splits[0]) if splits else 'train')}")
    state = folder / STATE
    if state.exists():
        try:
            names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TableRefused(f"{state} does not list the data files (_data_files): {exc!r}") from None
        if any(not isinstance(n, str) or Path(n).name != n or n in ("", ".", "..") for n in names):
            raise TableRefused(f"{state} lists a data file outside its folder: {names[:5]}")
        files = [folder / name for name in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise TableRefused(f"{folder} lacks data files its {STATE} lists: {', '.join(missing[:5])}")
        return files
    if (folder / INFO).exists():
        files = sorted(folder.glob("data-*.arrow"))
        if files:
            return files
    raise TableRefused(f"{folder} is a folder but not a dataset saved with datasets' save_to_disk "
                       f"(no {STATE}); pass a JSONL or Parquet file, or such a folder")


def _check_columns(path: Path, names: list[str], columns: Columns) -> None:
    """A named column the table lacks, or a table with none of the three forms, is refused whole."""
    have = ", ".join(names[:20]) or "none"
    if columns.messages is not None and columns.messages not in names:
        raise TableRefused(f"{path} has no column {columns.messages!r} (--messages-column); its columns: {have}")
    if columns.id != "id" and columns.id not in names:
        raise TableRefused(f"{path} has no column {columns.id!r} (--id-column); its columns: {have}")
    if columns.messages is None and not any(form in names for form in FORMS):
        raise TableRefused(f"{path} has no column 'messages', 'conversations' or 'prompt'; its columns: {have}: "
                           f"name the conversation's with --messages-column")


def _row_prompt(row: dict, number: int, columns: Columns) -> Prompt | BadLine:
    """One row as a Prompt or a BadLine; never raises (one row cannot stop the others)."""
    try:
        return parse_record({str(k): _plain(v) for k, v in row.items()}, number, columns)
    except InvalidPrompt as exc:
        return BadLine(number, str(exc))
    except Exception as exc:  # a case no rule foresaw: still this row's fault only
        return BadLine(number, f"unreadable row ({exc.__class__.__name__}: {exc})"[:500])


def _plain(value: object) -> object:
    """A cell as the JSON value a line would hold: times as ISO text, decimals as text, bytes
    as text where they are UTF-8 (else base64), Arrow maps (lists of pairs) as objects."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode()
    return value
