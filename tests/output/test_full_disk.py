"""A full disk: OUTPUT_DIR running out of space in the middle of a shard write is a storage outage.

Real redis-server, stand-in and `celery -A workers worker` process, and a real
small file system: OUTPUT_DIR is a 2 MiB tmpfs mounted by the test (root
only), filled by the test mid-run to within one page of its size, so the next
shard's temporary file is created and then refused (ENOSPC) part-way through
its bytes, then emptied again.
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import varied_prompts, write_prompts
from waiting import wait_until

SLOW = ("--step-base", "0.02", "--output-len-max", "100")  # about two seconds a generation
FEW_AT_A_TIME = {"FLEET_CONCURRENCY": "4", "FLEET_MAX_INFLIGHT_PER_SERVER": "4", "FLEET_SHARD_MAX_WAIT": "0.2"}
PAGE = 4096


@pytest.fixture
def small_disk(fleet):
    """OUTPUT_DIR on its own 2 MiB tmpfs, unmounted after the test."""
    folder = fleet.output_dir
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({mounted.stderr.strip()}); this test needs root")
    yield folder
    fleet.stop()  # nothing may hold a file there when it is unmounted
    subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave: int) -> Path:
    """A filler file taking all the space but about `leave` bytes."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as sink:
        for size in (1 << 16, PAGE):
            try:
                while True:
                    sink.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    free = os.statvfs(folder)
    assert free.f_bavail * free.f_frsize < PAGE
    os.truncate(filler, filler.stat().st_size - leave)
    return filler


def shard_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))


def leftovers(folder: Path) -> list[str]:
    """Temporary and probe files the writer left behind."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_full_disk_tears_no_shard_dead_letters_nothing_and_the_run_finishes_once_space_returns(
        fleet, small_disk, tmp_path):
    # Given OUTPUT_DIR on a 2 MiB file system, a slow server and a worker taking four prompts at a time
    _, url = fleet.standin(*SLOW)
    worker = fleet.worker("w1", [url], **FEW_AT_A_TIME)
    records = varied_prompts(30)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    wait_until(lambda: fleet.states().get("done", 0) >= 4, 120, "first samples", fleet)

    # When the disk fills to within one page, so the next shard write runs out of space part-way
    folder = small_disk / "default"
    filler = fill(small_disk, leave=PAGE)
    wait_until(lambda: "No space left on device" in worker.log.read_text(), 60, "a write to hit ENOSPC", fleet)
    wait_until(lambda: "consuming from nothing: storage failing" in worker.log.read_text(), 60,
               "the worker to stop taking prompts", fleet)

    # Then every file with a shard's name is a whole shard, and nothing is dead-lettered
    stored_before = {row["id"] for f in shard_files(folder) for row in pq.read_table(f).to_pylist()}
    assert fleet.dead_letters() == []

    # When space returns, the run finishes by itself: every prompt stored once, none dead, and no
    # temporary or probe file of the failed writes is left
    filler.unlink()
    assert fleet.wait_finished(timeout=180) == {"done": 30}
    assert fleet.dead_letters() == []
    ids = [row["id"] for f in shard_files(folder) for row in pq.read_table(f).to_pylist()]
    assert sorted(ids) == sorted(r["id"] for r in records)
    assert stored_before <= set(ids)
    assert leftovers(folder) == []
    log = worker.log.read_text()
    assert log.count("storage failing:") == 1 and log.count("storage back after") == 1
