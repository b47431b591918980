"""Shards in a folder (local disk or NFS): written under a temporary name, fsynced, hard-linked.

A shard is written to `.tmp-<name>` (created exclusively: never another
writer's file), fsynced, and given its final name with a hard link, which
fails rather than replace an existing file; then the folder is fsynced so the
name survives a power loss. A reader never sees a partial shard: temporary
names start with `.`, which `is_shard` skips.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable

from contract.storage.durable import fsync_path
from contract.storage.schema import is_shard


class LocalStore:
    def __init__(self, root: str):
        self.root = Path(root)

    def where(self, run: str) -> str:
        return str((self.root / run).resolve())

    def location(self, run: str, name: str) -> str:
        return str(self.root / run / name)

    def create(self, run: str, name: str, write: Callable[[BinaryIO], None]) -> str:
        folder = self.root / run
        folder.mkdir(parents=True, exist_ok=True)
        final, temporary = folder / name, folder / f".tmp-{name}"
        try:
            with open(temporary, "xb") as sink:  # exclusive: never another writer's file
                write(sink)
                sink.flush()
                os.fsync(sink.fileno())
            _publish(temporary, final)
        finally:
            _discard(temporary)
        fsync_path(folder)
        return str(final)

    def probe(self, run: str) -> None:
        """A small file written and fsynced where shards go (then removed): storage takes writes."""
        folder = self.root / run
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{secrets.token_hex(6)}"
        try:
            with open(probe, "xb") as sink:
                sink.write(b"probe")
                os.fsync(sink.fileno())
        finally:  # a full disk fails the close: the probe's name must not stay either
            _discard(probe)

    def shards(self, run: str) -> list[str]:
        folder = self.root / run
        return [str(p) for p in sorted(folder.glob("*.parquet")) if is_shard(p)] if folder.exists() else []

    def sizes(self, run: str) -> dict[str, int]:
        return {location: os.path.getsize(location) for location in self.shards(run)}

    def source(self, location: str) -> str:
        """What pyarrow opens: the path itself (pyarrow reads only the parts it needs)."""
        return location

    def stream(self, location: str) -> BinaryIO:
        return open(location, "rb")

    def preflight(self) -> None:
        """Nothing to check before start: a folder failing later is held like any outage, as
        it always was (a full disk at start clears on its own)."""


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


def _discard(temporary: Path) -> None:
    """The temporary name goes, whether the shard made it or not (best effort: storage
    may be what failed)."""
    try:
        temporary.unlink()
    except OSError:
        pass


def shard_files(output_dir: str | Path, run: str) -> list[Path]:
    """A run's shards in a folder, in name order (`contract/storage` lists them wherever they are)."""
    return [Path(p) for p in LocalStore(str(output_dir)).shards(run)]
