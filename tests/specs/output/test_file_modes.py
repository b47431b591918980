"""Shards and exports are readable by whom the user's umask lets read them, like any file the
user writes (files 0666 & ~umask, folders 0777 & ~umask): a trainer running as another user
reads an export without a chmod. Written through the real shard writer and `export_run`,
against a real redis-server."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from contract.ledger.codec import pack_ids
from contract.ledger.ledger import Ledger
from producer.export import export_run
from tests.specs.output.test_shards import sample
from tests.specs.test_export import spec
from workers.output.shards import ShardWriter


@pytest.fixture(params=[0o022, 0o027], ids=["umask 022", "umask 027"])
def umask(request):
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def everything_under(root: Path) -> list[Path]:
    return [root, *root.rglob("*")]


@pytest.mark.parametrize("format", ["parquet", "specforge"])
def test_shards_and_exports_follow_the_umask(client, tmp_path, umask, format):
    # Given shards written by the worker's shard writer, their prompts done in the ledger
    shards = tmp_path / "shards"
    writer = ShardWriter(str(shards), "w", max_rows=3, max_wait=0.05)
    paths = {i: writer.submit("r", sample(i)).result(timeout=10) for i in range(5)}
    writer.close()
    ledger = Ledger(client, "r")
    ledger.enqueue({f"p-{i}": pack_ids([1, 2]) for i in paths}, 1)
    for i, path in paths.items():
        ledger.mark_done(f"p-{i}", 2, path)

    # When the run is exported to a new folder
    dest = tmp_path / "out" / "dest"
    export_run(spec(), client, str(shards), dest, rows_per_file=2, format=format)

    # Then every folder is 0777 & ~umask and every file 0666 & ~umask, shards and export alike
    written = everything_under(shards) + everything_under(dest)
    assert len([p for p in written if p.is_file()]) >= 4
    for path in written:
        wanted = (0o777 if path.is_dir() else 0o666) & ~umask
        assert mode(path) == wanted, f"{path}: {oct(mode(path))}, not {oct(wanted)}"
    # and nothing of the export's staging is left beside it
    assert [p.name for p in dest.parent.iterdir()] == ["dest"]
