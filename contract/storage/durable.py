"""Making a file or a folder's entries durable: the one fsync both sides use.

A shard (worker) or an export file (producer) is written under a temporary
name, fsynced, given its final name, and then its folder is fsynced so the
name itself survives a power loss.
"""
from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or a folder by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(path: Path) -> None:
    """fsync a folder's entries; a file system that cannot fsync a folder is let be (its files are synced)."""
    try:
        fsync_path(path)
    except OSError:
        pass
