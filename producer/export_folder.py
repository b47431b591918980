"""Export's destination folder: replaced in one step, and only when it holds a previous export.

A reader of `DEST/*.parquet` sees one whole export, never two mixed. The
export is written into a fresh folder beside DEST (files and manifest each
written to a temporary name, fsynced, renamed: `write_atomically`), then
swapped with DEST in one step (`swap_into_place`: Linux
`renameat2(RENAME_EXCHANGE)` through ctypes; elsewhere two renames, between
which DEST is briefly absent, never mixed), and the previous export is
deleted. Exporting again is how a growing run is refreshed, so replacing is
the default; a DEST that holds anything but a previous export (a manifest and
`part-*.parquet` / `keep-*.parquet` files, or a format's files) is refused
rather than replaced, so export never deletes a user's files
(`check_replaceable`). What the export holds is `export.py`'s business.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
from pathlib import Path

from contract.storage.durable import fsync_folder

from . import formats

MANIFEST = "manifest.json"
CARD = "README.md"  # the dataset card (producer/card.py)


class ExportRefused(Exception):
    """DEST holds something that is not a previous export: it is left alone."""


def staging_beside(dest: Path) -> Path:
    """The fresh folder the export is written into, beside DEST (so the swap is a rename). A DEST
    whose folder cannot be made or written is refused here, naming DEST, before any shard is
    read: the error is the destination's, never the shards'."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return fresh_folder(dest.parent, f".{dest.name}.export-")
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ExportRefused(f"{dest} is not writable: {exc.strerror or exc}{where}") from None


def fresh_folder(parent: Path, prefix: str) -> Path:
    """A new folder `parent/<prefix><random>`, made with the permissions the umask gives any
    folder (0777 & ~umask), unlike `tempfile.mkdtemp`'s 0700: it becomes DEST, which a trainer
    running as another user must be able to read."""
    while True:
        folder = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


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
    return ((name.startswith(("part-", "keep-")) and name.endswith(".parquet")) or name.startswith(".tmp-")
            or name in formats.FILES or name == CARD)


def _is_manifest(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "run" in data and "files" in data


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all: written under a temporary name, fsynced, renamed."""
    temporary = path.with_name(f".tmp-{path.name}")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)


def write_manifest(folder: Path, manifest: dict) -> None:
    """The export's manifest, written atomically and made durable in `folder`."""
    write_atomically(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
    fsync_folder(folder)


def swap_into_place(staging: Path, dest: Path) -> None:
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
