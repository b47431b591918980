"""Shard files never collide, even between workers whose node name and pid coincide.

Containers where every worker is pid 1, or pods on the host network, give two
workers the same node name and the same pid. Each worker here runs in its own
pid namespace (`unshare --pid`), so both are pid 1, under one node name, and
both write shards of one run into one folder at once.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter

import httpx
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from producer.local import Process, free_port, spawn

from conftest import varied_prompts, write_prompts
from waiting import wait_until


class _InPidNamespace(Process):
    """`unshare --fork` ignores SIGTERM while it waits for its child: a signal goes to the
    process group (unshare, and the worker inside), so stopping drains the worker at once
    instead of waiting 20 s for the SIGKILL that ends unshare and, with it, the worker."""

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)


def _as_pid_one(fleet, name: str, servers: list[str], **extra: str) -> tuple[object, int]:
    """`celery -A workers worker` as pid 1 of a new pid namespace, named `same@node`; and its metrics port."""
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-m", "celery",
            "-A", "workers", "worker", "-n", "same@node", "-l", "INFO", "--without-mingle", "--without-gossip"]
    port = free_port()
    env = fleet.env(SGLANG_URLS=",".join(servers), FLEET_SHARD_MAX_ROWS="2", FLEET_SHARD_MAX_WAIT="0.05",
                    FLEET_METRICS_PORT=str(port), **extra)
    spawned = spawn(name, argv, fleet.logs, env=env)
    process = _InPidNamespace(spawned.name, spawned.popen, spawned.log)
    fleet.processes.append(process)
    return process, port


def _wait_consuming(workers: list[tuple[object, int]], fleet) -> None:
    """Until each worker consumes its queue: one that starts late would find the other had
    taken every prompt, and write nothing the test could compare."""
    wait_until(lambda: all("consuming from fleet.generate" in process.log.read_text(errors="replace")
                           for process, _ in workers), 90, "both workers consuming", fleet)


def _shard_commits(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "fleet_shard_commits_total")


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=20)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare (pid namespaces)")
def test_two_workers_with_the_same_node_name_and_pid_never_write_the_same_shard(fleet, tmp_path):
    # Given two workers that are both pid 1 and both named same@node, sharing one OUTPUT_DIR
    _, url = fleet.standin("--max-running-requests", "64")
    workers = [_as_pid_one(fleet, name, [url]) for name in ("w1", "w2")]
    _wait_consuming(workers, fleet)

    # When they store 200 prompts in shards of two samples, side by side
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(200))))
    assert fleet.wait_finished() == {"done": 200}

    # Then both did write (as pid 1), and every shard is whole and readable, none replaced:
    # the shards hold every prompt, and a prompt stored twice holds identical tokens
    for process, port in workers:
        assert _shard_commits(port) > 0, process.tail()
    rows = fleet.rows()
    counts = Counter(r["id"] for r in rows)
    assert set(counts) == {f"p-{i:04d}" for i in range(200)}
    assert len({r["worker"] for r in rows}) == 1  # the same name on both sides
    folder = fleet.output_dir / "default"
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    for path in folder.glob("*.parquet"):
        pq.read_table(path)  # an interleaved file would not read
    assert sum(pq.read_metadata(p).num_rows for p in folder.glob("*.parquet")) == len(rows)
