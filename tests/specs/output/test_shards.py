"""The shard writer, on a temporary folder: group commit, durable names, exact rows.

Given a writer with small limits, when samples are submitted from several
threads, then each future resolves only once its sample is in a shard under a
final name, the rows read back are exactly the samples, a shard holds many
samples, and no temporary file is left behind.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq

from contract.storage.local import shard_files
from contract.storage.schema import COLUMNS, Sample, arrow_schema
from workers.output.shards import ShardWriter


def sample(i: int) -> Sample:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return Sample(id=f"p-{i}", input_ids=list(range(i, i + 5)) + [128822, 1], prompt_len=5, output_len=2,
                  finish_reason="stop", stop_token=1, think_end_index=5, run="r", server="http://s",
                  model="m", max_new_tokens=64, temperature=0.5, top_p=0.75, attempts=1, worker="w",
                  tokenizer_fingerprint="t", template_fingerprint="g", e2e_latency=0.25,
                  started_at=now, finished_at=now)


def read_back(root: Path) -> dict[str, dict]:
    return {row["id"]: row for f in shard_files(root, "r") for row in pq.read_table(f).to_pylist()}


def test_a_full_group_is_one_shard_and_every_future_names_it(tmp_path):
    writer = ShardWriter(str(tmp_path), "w", max_rows=10, max_wait=30)
    futures = [writer.submit("r", sample(i)) for i in range(10)]
    paths = {f.result(timeout=10) for f in futures}
    writer.close()
    assert len(paths) == 1 and Path(paths.pop()) in shard_files(tmp_path, "r")


def test_a_partial_group_is_written_once_its_oldest_sample_has_waited(tmp_path):
    writer = ShardWriter(str(tmp_path), "w", max_rows=1000, max_wait=0.1)
    path = writer.submit("r", sample(1)).result(timeout=10)
    writer.close()
    assert Path(path).exists()


def test_rows_read_back_are_exactly_the_samples_in_the_contract_schema(tmp_path):
    writer = ShardWriter(str(tmp_path), "w", max_rows=7, max_wait=0.05)
    with ThreadPoolExecutor(8) as threads:
        futures = list(threads.map(lambda i: writer.submit("r", sample(i)), range(50)))
    for f in futures:
        f.result(timeout=10)
    writer.close()
    rows = read_back(tmp_path)
    assert set(rows) == {f"p-{i}" for i in range(50)}
    assert rows["p-3"]["input_ids"] == [3, 4, 5, 6, 7, 128822, 1]
    assert tuple(rows["p-3"]) == COLUMNS
    assert pq.read_schema(shard_files(tmp_path, "r")[0]).equals(arrow_schema(), check_metadata=False)


def test_close_writes_what_is_pending_and_leaves_no_temporary_file(tmp_path):
    writer = ShardWriter(str(tmp_path), "w", max_rows=1000, max_wait=3600)
    futures = [writer.submit("r", sample(i)) for i in range(3)]
    writer.close()
    assert all(f.result(timeout=1) for f in futures)
    assert [p.name for p in (tmp_path / "r").iterdir() if p.name.startswith(".")] == []


def test_two_writers_with_the_same_node_name_and_pid_never_share_a_file(tmp_path):
    # Given two writers as two workers would be in containers where both are pid 1 on one host name
    first, second = (ShardWriter(str(tmp_path), "same@host", max_rows=1, max_wait=0.01) for _ in range(2))
    # When both write many shards at once
    with ThreadPoolExecutor(8) as threads:
        futures = list(threads.map(lambda i: (first if i % 2 else second).submit("r", sample(i)), range(40)))
    paths = {f.result(timeout=10) for f in futures}
    first.close(), second.close()
    # Then no shard was written over: every file is readable and every sample is in exactly one
    files = shard_files(tmp_path, "r")
    assert {str(f) for f in files} == paths
    ids = [row["id"] for f in files for row in pq.read_table(f).to_pylist()]
    assert sorted(ids) == sorted(f"p-{i}" for i in range(40))
