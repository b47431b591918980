"""Export's destination: replaced whole when it is a previous export, refused otherwise."""
from __future__ import annotations

import json

import pytest

from producer.export_folder import ExportRefused, check_replaceable, swap_into_place


def _export(folder, *parts: str):
    folder.mkdir(parents=True)
    for name in parts:
        (folder / name).write_bytes(name.encode())
    (folder / "manifest.json").write_text(json.dumps({"run": "r", "files": [{"name": p} for p in parts]}))
    return folder


def test_an_absent_an_empty_folder_and_a_previous_export_may_be_replaced(tmp_path):
    check_replaceable(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")
    check_replaceable(_export(tmp_path / "previous", "part-00000.parquet"))


@pytest.mark.parametrize("stranger", ["notes.txt", "part-00000.parquet.bak", "sub/"])
def test_a_folder_holding_anything_else_is_refused(tmp_path, stranger):
    dest = _export(tmp_path / "dest", "part-00000.parquet")
    (dest / stranger.rstrip("/")).mkdir() if stranger.endswith("/") else (dest / stranger).write_text("mine")
    with pytest.raises(ExportRefused, match="not a previous export"):
        check_replaceable(dest)


def test_parquet_files_without_a_manifest_are_refused(tmp_path):
    # e.g. the run's own shard folder given as DEST by mistake
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "part-00000.parquet").write_bytes(b"x")
    with pytest.raises(ExportRefused):
        check_replaceable(shards)
    with pytest.raises(ExportRefused):
        check_replaceable(tmp_path)  # a folder above it


def test_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ExportRefused, match="not a folder"):
        check_replaceable(tmp_path / "f")


def test_the_swap_leaves_only_the_new_export_in_place(tmp_path):
    # Given a previous export of two files and a new one of one file beside it
    dest = _export(tmp_path / "dest", "part-00000.parquet", "part-00001.parquet")
    staging = _export(tmp_path / ".dest.export-1", "part-00000.parquet")
    (staging / "part-00000.parquet").write_bytes(b"new")

    # When it is swapped into place
    swap_into_place(staging, dest)

    # Then DEST holds exactly the new export, and the staging folder the previous one
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "part-00000.parquet"]
    assert (dest / "part-00000.parquet").read_bytes() == b"new"
    assert sorted(p.name for p in staging.iterdir()) == ["manifest.json", "part-00000.parquet",
                                                         "part-00001.parquet"]


def test_a_first_export_is_renamed_into_place(tmp_path):
    staging = _export(tmp_path / ".dest.export-1", "part-00000.parquet")
    swap_into_place(staging, tmp_path / "dest")
    assert (tmp_path / "dest" / "part-00000.parquet").exists() and not staging.exists()
