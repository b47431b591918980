"""Export into a bucket: each part uploaded as soon as it is written, the manifest last.

A bucket has no folder to swap, so an export at `s3://bucket/dest` is replaced
for readers by its manifest. Each export's parts go under a prefix of their own,
`dest/<export id>/part-*.parquet`, created once and never replaced (the store's
create-only upload); `dest/manifest.json` is written last, in one PUT, so a
reader sees the previous manifest or the new one, each whole, and every part a
manifest names exists while it is the manifest. Readers go through the manifest
(its `files` are keys relative to `dest/`), never list the prefix. The previous
export's parts are deleted once the new manifest is in place, as a folder
export's previous folder is. The dataset card (`dest/README.md`,
`producer/card.py`) is put just before the manifest, replacing the previous
one. A `dest/` that holds anything but a previous export (parts, manifest,
card) is refused, so export never deletes a user's objects.

Local disk holds one part at a time: a part is uploaded and deleted as soon as
it is complete (`Uploader`), and its figures (rows, tokens, id-set digest) are
counted from it first. One process writes it (`--jobs` is for folder exports).
"""
from __future__ import annotations

import json
import secrets
import shutil
import time
from pathlib import Path

from contract.storage import parse, store_for

from . import formats
from .export_folder import CARD, MANIFEST, ExportRefused


class Uploader:
    """What the export's writer calls with each finished part: upload it, count it, delete it."""

    def __init__(self, dest: str, count: bool = True):
        self.store, self.count = store_for(dest), count  # count: a part of rows (not an index's keep file)
        self.export_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)
        self.figures = formats.Figures()

    def __call__(self, path: Path) -> str:
        """Upload `path` under this export's prefix; returns its name relative to `dest/`."""
        if self.count:
            formats.count_parquet(self.figures, path)
        with open(path, "rb") as part:
            self.store.create(self.export_id, path.name, lambda sink: shutil.copyfileobj(part, sink, 2**20))
        path.unlink()
        return f"{self.export_id}/{path.name}"


def previous_parts(dest: str) -> list[str]:
    """The keys of the export at `dest` to delete once a new one is in place; refuses a
    `dest/` holding objects that no previous export there names."""
    store = store_for(dest)
    base = store.where("")  # s3://bucket/dest/
    prefix = base.split("/", 3)[3]
    keys = store.keys(prefix)
    if not keys:
        return []
    manifest = _read_manifest(store, base)
    named = {prefix + f["name"] for f in manifest.get("files", [])} if manifest else set()
    strangers = [k for k in keys if k not in (prefix + MANIFEST, prefix + CARD) and k not in named]
    if manifest is None or strangers:
        raise ExportRefused(f"{base} holds objects that are not a previous export "
                            f"({', '.join(strangers[:5] or keys[:5])}); export to an empty prefix")
    return sorted(named)


def publish(dest: str, manifest: dict, previous: list[str], card: str | None = None) -> None:
    """The dataset card, then the manifest, last and whole (it is what readers open); then the
    previous parts go."""
    store = store_for(dest)
    base = store.where("").split("/", 3)[3]
    if card is not None:
        store.replace(base + CARD, card.encode(), "text/markdown; charset=utf-8")
    body = json.dumps(manifest, indent=2, sort_keys=True).encode()
    store.replace(base + MANIFEST, body, "application/json")
    for old in previous:
        store.delete(old)


def _read_manifest(store, base: str) -> dict | None:
    try:
        data = json.loads(store.stream(base + MANIFEST).read())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) and "run" in data and "files" in data else None


def is_bucket(dest: str) -> bool:
    """Whether DEST is a bucket; raises `UnsupportedOutput` for a form export cannot write to."""
    return parse(str(dest), "DEST")[0] == "s3"

