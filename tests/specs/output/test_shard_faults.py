"""The shard writer against bad rows and failing storage, on a temporary folder.

Given a writer, when one sample is bad, then only its task learns it (the rest
of its group is written); when the run's folder stops taking writes (a file
where the folder was: what `chmod` cannot do to root), then the waiting tasks
keep waiting, the writer says storage is failing, and once the folder is back
every sample is written; a sample withdrawn meanwhile never is.
"""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contract.storage.local import shard_files
from contract.storage.schema import Sample
from workers.output.shards import BadSample, ShardWriter, StorageUnavailable, check_sample

from waiting import wait_until


def sample(i: int, **changes) -> Sample:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    row = Sample(id=f"p-{i}", input_ids=[i, i + 1, i + 2, 128822, 1], prompt_len=3, output_len=2,
                 finish_reason="stop", stop_token=1, think_end_index=3, run="r", server="http://s",
                 model="m", max_new_tokens=64, temperature=0.5, top_p=0.75, attempts=1, worker="w",
                 tokenizer_fingerprint="t", template_fingerprint="g", e2e_latency=0.25,
                 started_at=now, finished_at=now)
    return dataclasses.replace(row, **changes)


def stored_ids(root: Path) -> list[str]:
    return sorted(i for f in shard_files(root, "r") for i in pq.read_table(f).column("id").to_pylist())


def break_storage(root: Path) -> Path:
    """Put a file where the run's folder was (root ignores permissions, not this)."""
    aside = root / "r-aside"
    if (root / "r").exists():
        (root / "r").rename(aside)
    (root / "r").write_text("not a folder")
    return aside


def repair_storage(root: Path, aside: Path) -> None:
    (root / "r").unlink()
    if aside.exists():
        aside.rename(root / "r")


@pytest.mark.parametrize("changes, why", [
    ({"input_ids": [1, 2, 2**31, 128822, 1]}, "outside"),
    ({"input_ids": [1, 2, -1, 128822, 1]}, "outside"),
    ({"input_ids": [1, 2, 3.0, 128822, 1]}, "float"),
    ({"input_ids": [1, 2, None, 128822, 1]}, "NoneType"),
    ({"input_ids": [1, 2, True, 128822, 1]}, "bool"),
    ({"output_len": 3}, "prompt_len"),
    ({"think_end_index": 9}, "think_end_index"),
])
def test_a_row_the_schema_cannot_hold_is_refused_before_it_joins_a_group(changes, why):
    with pytest.raises(BadSample, match=why):
        check_sample(sample(1, **changes))


def test_one_bad_row_fails_only_its_own_task_and_its_group_is_written(tmp_path):
    # Given a group of five samples, one with a field Arrow refuses (that the check does not cover)
    writer = ShardWriter(str(tmp_path), "w", max_rows=5, max_wait=30)
    futures = [writer.submit("r", sample(i, server=123) if i == 2 else sample(i)) for i in range(5)]
    # Then only that one's task gets the error, and the other four are in one shard
    with pytest.raises(BadSample, match="shard schema"):
        futures[2].result(timeout=10)
    paths = {futures[i].result(timeout=10) for i in (0, 1, 3, 4)}
    writer.close()
    assert len(paths) == 1 and stored_ids(tmp_path) == ["p-0", "p-1", "p-3", "p-4"]


def test_failing_storage_holds_the_samples_and_writes_them_once_it_is_back(tmp_path):
    # Given a writer whose run folder has become a file
    writer = ShardWriter(str(tmp_path), "w", max_rows=1000, max_wait=0.05, retry_base=0.05, retry_max=0.2)
    writer.submit("r", sample(0)).result(timeout=10)
    aside = break_storage(tmp_path)
    # When samples are handed over, they wait and storage is reported failing
    futures = [writer.submit("r", sample(i)) for i in range(1, 6)]
    # (while the writer tries three times more)
    wait_until(lambda: writer.storage.failures >= 3, 10, "three failed writes", poll=0.02)
    assert not writer.storage.up and not any(f.done() for f in futures)
    assert "FileExistsError" in writer.storage.last_error
    # When the folder is back, every sample is written and storage is up again
    repair_storage(tmp_path, aside)
    assert all(f.result(timeout=10) for f in futures)
    assert writer.storage.up and writer.storage.failures == 0
    writer.close()
    assert stored_ids(tmp_path) == [f"p-{i}" for i in range(6)]
    assert [p.name for p in (tmp_path / "r").iterdir() if p.name.startswith(".")] == []


def test_a_withdrawn_sample_is_never_written_and_a_probe_finds_storage_back(tmp_path):
    # Given failing storage and two waiting samples, one of which is withdrawn
    writer = ShardWriter(str(tmp_path), "w", max_rows=1000, max_wait=0.05, retry_base=1, retry_max=1)  # a second to withdraw in
    aside = break_storage(tmp_path)
    kept, withdrawn = writer.submit("r", sample(1)), writer.submit("r", sample(2))
    wait_until(lambda: not writer.storage.up, 10, "storage failing", poll=0.02)
    assert writer.withdraw(withdrawn) and not writer.withdraw(withdrawn)
    repair_storage(tmp_path, aside)
    kept.result(timeout=10)
    assert not withdrawn.done() and stored_ids(tmp_path) == ["p-1"]
    # When storage fails again and every sample is withdrawn, a probe still sees it come back
    aside = break_storage(tmp_path)
    last = writer.submit("r", sample(3))
    wait_until(lambda: not writer.storage.up, 10, "storage failing", poll=0.02)
    assert writer.withdraw(last)
    repair_storage(tmp_path, aside)
    wait_until(lambda: writer.storage.up, 10, "storage back", poll=0.02)
    writer.close()
    assert stored_ids(tmp_path) == ["p-1"]


def test_closing_while_storage_fails_tells_the_waiting_tasks(tmp_path):
    writer = ShardWriter(str(tmp_path), "w", max_rows=1000, max_wait=0.05, retry_base=5, retry_max=5)
    break_storage(tmp_path)
    future = writer.submit("r", sample(1))
    wait_until(lambda: not writer.storage.up, 10, "storage failing", poll=0.02)
    writer.close()
    with pytest.raises(StorageUnavailable):
        future.result(timeout=1)
