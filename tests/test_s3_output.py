"""Shards in an S3 bucket: the same exactly-once promise as on disk, against a real S3 HTTP server.

moto's server runs as its own process (`producer/local_s3.py`); workers and
producer commands reach it through the standard AWS variables only, with
`OUTPUT_DIR=s3://traces/runs`. Each case ends with the same checks: every
prompt in exactly one place (done, or dead with its reason), every shard
object readable, and the export holding each done id once.
"""
from __future__ import annotations

import json
import signal
import time
from collections import Counter

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from contract.ledger.ledger import Ledger, shard_code

from conftest import varied_prompts, write_prompts
from producer.local_s3 import BUCKET, start_s3
from waiting import wait_until

OUTPUT = f"s3://{BUCKET}/runs"
RUN_PREFIX = "runs/default/"
LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}
FAULTS = ["--step-base", "0.02", "--output-len-max", "100", "--fault-missing-think-end", "0.1",
          "--fault-http500-first", "0.1"]  # about two seconds a generation
# Four prompts at a time per worker, so the run outlasts the faults; an upload to a frozen store
# gives up within the commit timeout (connect and answer a quarter of it each, two attempts).
SLOW_RUN = {"FLEET_CONCURRENCY": "4", "FLEET_MAX_INFLIGHT_PER_SERVER": "4", "FLEET_SHARD_MAX_ROWS": "8",
            "FLEET_SHARD_COMMIT_TIMEOUT": "20", "FLEET_RETRY_BACKOFF": "0.05"}


@pytest.fixture
def s3(tmp_path):
    server = start_s3(tmp_path / "logs")
    yield server
    server.stop()


def on_s3(s3, **extra: str) -> dict[str, str]:
    return {**s3.env, "OUTPUT_DIR": OUTPUT, **extra}


def shard_rows(s3) -> dict[str, list[str]]:
    """Each shard object of the run and the ids it holds (every one must read whole)."""
    client = s3.client()
    found = {}
    for key in s3.keys(RUN_PREFIX):
        if key.rsplit("/", 1)[1].startswith((".", "_")):
            continue
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        found[key] = pq.read_table(pa.BufferReader(body), columns=["id"]).column("id").to_pylist()
    return found


def assert_exactly_once(fleet, s3, tmp_path, prompts: list[str]) -> dict:
    """Every prompt done or dead (never both), each done one in the shard the ledger names,
    no stray object, and the export (to a local folder, from the bucket) holding each done id once."""
    ledger = Ledger(redis.Redis.from_url(fleet.redis_url), "default")
    entries = dict(zip(prompts, ledger.entries(prompts)))
    dead = {letter["id"] for letter in json.loads(fleet.producer("dead", "list", "--json", **on_s3(s3)).stdout)}
    done = {pid for pid, entry in entries.items() if entry.state == "done"}
    assert done | dead == set(prompts) and not done & dead
    shards = shard_rows(s3)
    assert all(key.rsplit("/", 1)[1].startswith("part-") for key in shards)
    assert [k for k in s3.keys(RUN_PREFIX) if k not in shards] == []  # no probe or partial object left
    for pid in done:
        canonical = [k for k, ids in shards.items() if shard_code(k) == entries[pid].shard]
        assert len(canonical) == 1 and pid in shards[canonical[0]]
    export = tmp_path / "export"
    fleet.producer("export", str(export), **on_s3(s3))
    manifest = json.loads((export / "manifest.json").read_text())
    exported = Counter(i for f in manifest["files"]
                       for i in pq.read_table(export / f["name"], columns=["id"]).column("id").to_pylist())
    assert set(exported) == done and set(exported.values()) == {1}
    assert manifest["source"] == f"{OUTPUT}/default/" and manifest["source_shards"] == len(shards)
    assert s3.env["AWS_SECRET_ACCESS_KEY"] not in (export / "manifest.json").read_text()
    return shards


def test_an_object_is_created_once_whole_and_a_failed_upload_in_parts_is_aborted(s3, monkeypatch):
    from contract.storage import store_for

    # Given the bucket store, told to upload in 5 MiB parts anything above 1 MiB
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    store = store_for(OUTPUT, 60.0)
    store.single_put_max, store.part_bytes = 2**20, 5 * 2**20
    body = bytes(range(256)) * (6 * 2**20 // 256)

    # When a shard of 6 MiB is created, it is one whole object
    location = store.create("r", "part-big.parquet", lambda sink: sink.write(body))
    assert store.stream(location).read() == body and store.shards("r") == [location]

    # and creating the same name again, in one PUT or in parts, is refused (412), never a replace,
    # and the refused upload in parts is aborted, not left behind
    with pytest.raises(FileExistsError):
        store.create("r", "part-big.parquet", lambda sink: sink.write(b"x" * 7 * 2**20))
    store.single_put_max = 2**30
    with pytest.raises(FileExistsError):
        store.create("r", "part-big.parquet", lambda sink: sink.write(b"small"))
    assert store.stream(location).read() == body
    assert s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def storage_seen(fleet, s3, up: bool) -> bool:
    workers = json.loads(fleet.producer("status", "--json", **on_s3(s3)).stdout)["workers"]
    return bool(workers) and all(w["storage"]["up"] == up for w in workers)


def test_a_run_with_faults_a_killed_worker_and_a_20s_store_outage_stores_each_prompt_once(fleet, s3, tmp_path):
    # Given two workers writing shards to the bucket, and a stand-in planting faults
    _, url = fleet.standin(*FAULTS)
    prompts = varied_prompts(60)
    ids = [p["id"] for p in prompts]
    workers = [fleet.worker(name, [url], **on_s3(s3, **SLOW_RUN, **LEASE)) for name in ("w1", "w2")]
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts)), **on_s3(s3))

    # When one worker is SIGKILLed mid-run
    wait_until(lambda: fleet.states().get("done", 0) >= 8, 180, "the first shards stored", fleet)
    workers[1].kill()
    assert workers[1].popen.returncode == -signal.SIGKILL

    # and the store stops answering for 20 s while the other goes on
    s3.freeze()
    frozen = time.monotonic()
    try:
        wait_until(lambda: storage_seen(fleet, s3, up=False), 120, "the worker seeing the store down", fleet)
        status = fleet.producer("status", "--json", **on_s3(s3)).stdout
        assert "ReadTimeout" in status and s3.env["AWS_SECRET_ACCESS_KEY"] not in status
        done_during = fleet.states().get("done", 0)
        time.sleep(max(0.0, 20 - (time.monotonic() - frozen)))  # the outage's length, not a synchronisation
        assert fleet.states().get("done", 0) == done_during  # nothing is marked done without its shard
    finally:
        s3.thaw()

    # Then the worker goes on by itself, and the run ends with every prompt in one place
    wait_until(lambda: storage_seen(fleet, s3, up=True), 120, "the store seen up again", fleet)
    fleet.wait_finished(timeout=300)
    assert_exactly_once(fleet, s3, tmp_path, ids)
    reasons = {letter["reason"] for letter in fleet.dead_letters()}
    assert reasons <= {"missing_think_end"}  # the planted fault only: the outage dead-lettered nothing
    assert "storage failing" in workers[0].log.read_text()
    secret = s3.env["AWS_SECRET_ACCESS_KEY"]
    assert secret not in workers[0].log.read_text() and secret not in json.dumps(fleet.dead_letters())


def test_a_worker_that_dies_right_after_its_upload_is_reconciled_not_generated_again(fleet, s3, tmp_path):
    from intake.test_reconcile import (N, GROUP_WAIT, POOL, die_between_link_and_done, reconciled_ids,
                                       republished_by_audit)

    # Given a worker that uploads one group of all N prompts and dies right after the upload
    _, url = fleet.standin("--step-base", "0.002")
    victim = fleet.worker("victim", [url], **on_s3(s3, FLEET_SHARD_MAX_ROWS="1000",
                                                   FLEET_SHARD_MAX_WAIT=str(GROUP_WAIT), **LEASE, **POOL))
    prompts = varied_prompts(N)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts)), **on_s3(s3))
    wait_until(lambda: len(httpx.get(f"{url}/standin/stats").json()["generations"]) == N, 120,
               "every prompt generated, its sample waiting for the group commit", fleet)
    die_between_link_and_done(victim, None, redis.Redis.from_url(fleet.redis_url),
                              shards=lambda: list(shard_rows(s3)))
    assert fleet.states() == {"queued": N}

    # When another worker takes the prompts up
    survivor = fleet.worker("survivor", [url], **on_s3(s3, **LEASE))
    assert fleet.wait_finished(timeout=180) == {"done": N}

    # Then none was generated again: each was found in the uploaded object, the only one
    generations = httpx.get(f"{url}/standin/stats").json()["generations"]
    assert len(generations) == N and set(generations.values()) == {1}
    ids = [p["id"] for p in prompts]
    assert reconciled_ids(survivor.log.read_text()) == sorted(ids)  # each found once: its message came back once
    assert not republished_by_audit(survivor.log.read_text())
    (shard,) = assert_exactly_once(fleet, s3, tmp_path, ids)
    assert shard.startswith(RUN_PREFIX)

    # and every reader reads the run where it is: an export into the bucket (twice: the
    # second replaces the first through its manifest), the index, the report, show
    for _ in range(2):
        fleet.producer("export", f"s3://{BUCKET}/exports/default", **on_s3(s3))
        assert sorted(exported_ids(s3, "exports/default/")) == ids
    assert len([k for k in s3.keys("exports/default/") if k.endswith(".parquet")]) == 1  # the first one's gone
    # and the dataset card is beside it, naming the server that made the samples
    card = s3.client().get_object(Bucket=BUCKET, Key="exports/default/README.md")["Body"].read().decode()
    assert card.startswith("---\n") and "reasoning_fleet:" in card and "| http://127.0.0.1:" in card
    fleet.producer("export", "--index-only", str(tmp_path / "index"), **on_s3(s3))
    keep = pq.read_table(tmp_path / "index" / "keep-000.parquet").to_pylist()
    assert sorted(r["id"] for r in keep) == ids and {r["shard"] for r in keep} == {shard.rsplit("/", 1)[1]}
    fleet.producer("report", "--out", str(tmp_path / "report.html"), **on_s3(s3))
    assert f"{OUTPUT}/default/" in (tmp_path / "report.html").read_text()
    shown = fleet.producer("show", ids[0], **on_s3(s3)).stdout
    assert f"s3://{BUCKET}/{shard}" in shown


def exported_ids(s3, prefix: str) -> list[str]:
    """The ids of the export at `prefix`, read the way its readers are told to: through its manifest."""
    client = s3.client()
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key=prefix + "manifest.json")["Body"].read())
    parts = [client.get_object(Bucket=BUCKET, Key=prefix + f["name"])["Body"].read() for f in manifest["files"]]
    return [i for part in parts for i in pq.read_table(pa.BufferReader(part), columns=["id"]).column("id").to_pylist()]


def test_two_workers_with_one_name_and_pid_never_replace_each_others_objects(fleet, s3, tmp_path):
    from output.test_shard_names import _as_pid_one, _can_unshare, _shard_commits, _wait_consuming

    if not _can_unshare():
        pytest.skip("needs root and unshare (pid namespaces)")
    # Given two workers that are both pid 1 and both named same@node, writing to one bucket prefix
    _, url = fleet.standin("--max-running-requests", "64")
    workers = [_as_pid_one(fleet, name, [url], **on_s3(s3)) for name in ("w1", "w2")]
    _wait_consuming(workers, fleet)

    # When they store 80 prompts in shards of two samples, side by side
    prompts = varied_prompts(80)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", prompts)), **on_s3(s3))
    assert fleet.wait_finished() == {"done": 80}

    # Then both wrote, every object is whole, and the rows add up to the commits: none replaced
    commits = [_shard_commits(port) for _, port in workers]
    assert all(commits), [p.tail() for p, _ in workers]
    shards = assert_exactly_once(fleet, s3, tmp_path, [p["id"] for p in prompts])
    assert len(shards) == sum(commits)


def test_a_worker_and_every_command_refuse_what_they_cannot_write_to(fleet, tmp_path):
    # Given a store that checks credentials, which knows none of ours
    guarded = start_s3(tmp_path / "logs", auth=True)
    try:
        _, url = fleet.standin()
        # When a worker starts with the wrong credential, it refuses with a line naming the fix
        worker = fleet.worker("w", [url], **on_s3(guarded))
        wait_until(lambda: not worker.alive(), 120, "the worker refusing to start", fleet)
        assert worker.popen.returncode != 0
        log = worker.log.read_text()
        assert "worker refused to start" in log and "AWS_ACCESS_KEY_ID" in log
        assert guarded.env["AWS_SECRET_ACCESS_KEY"] not in log
    finally:
        guarded.stop()

    # When OUTPUT_DIR names a scheme the fleet does not serve, or s3: without a bucket
    for value in ("gs://traces/runs", "s3:/traces/runs"):
        worker = fleet.worker(f"w-{value[:2]}", [url], OUTPUT_DIR=value)
        wait_until(lambda: not worker.alive(), 120, "the worker refusing to start", fleet)
        assert worker.popen.returncode != 0 and "must be a folder" in worker.log.read_text()
        for command in (["status"], ["export", str(tmp_path / "export")], ["report"]):
            result = fleet.producer(*command, check=False, OUTPUT_DIR=value)
            assert result.returncode == 2, result.stderr
            assert "s3://bucket/prefix" in result.stderr and "Traceback" not in result.stderr
    # Then nothing was written to a local folder named after the scheme
    assert not (fleet.tmp / "s3:").exists() and not (fleet.tmp / "gs:").exists()
