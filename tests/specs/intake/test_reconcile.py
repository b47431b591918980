"""A group commit's ledger side, on a temporary folder and a real redis-server.

The shard writer with its book notes each row's shard before the write,
marks the group done in one call after the link, and leaves no entry behind;
a failed write leaves no entry naming a file that does not hold its rows. A
delivery finding an entry marks the prompt done where the file holds its row,
and drops the entry where it does not.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq

from contract.ledger.codec import pack_ids
from contract.keys import RunKeys
from contract.ledger.ledger import Entry, Ledger, shard_code
from contract.broker.kombu_redis import UNACKED, UNACKED_INDEX
from workers.intake import deliveries
from workers.intake.group_acks import GROUP_ACKS
from workers.intake.reconcile import ShardBook, reconciled
from workers.output.shards import ShardWriter

from waiting import wait_until

from ..output.test_shard_faults import break_storage, repair_storage, sample


def queued(client, n: int) -> Ledger:
    ledger = Ledger(client, "r")
    ledger.enqueue({f"p-{i}": pack_ids([1, 2, 3]) for i in range(n)})
    return ledger


def test_a_group_is_marked_done_by_the_writer_before_its_tasks_are_released(client, tmp_path):
    # Given five queued prompts, delivered to a worker, and a writer with the ledger's book
    ledger = queued(client, 5)
    for i in range(5):
        deliveries.note(client, "r", f"p-{i}", "w")
    writer = ShardWriter(str(tmp_path), "w", max_rows=5, max_wait=30, book=ShardBook(client))
    # When their samples are committed as one group
    paths = {f.result(timeout=10) for f in [writer.submit("r", sample(i)) for i in range(5)]}
    writer.close()
    # Then every task learns one shard, by which time each prompt is done there, its writing
    # entry and its deliveries gone
    assert len(paths) == 1 and not client.exists(RunKeys("r").deliveries)
    code = shard_code(paths.pop())
    assert ledger.entries([f"p-{i}" for i in range(5)]) == [Entry("done", shard=code)] * 5
    assert ledger.tally().output_tokens == 10 and not client.exists(RunKeys("r").writing)


def test_a_group_commit_acknowledges_the_messages_of_the_tasks_still_waiting_for_it(client, tmp_path):
    # Given four queued prompts whose messages a worker holds, and tasks for three of them waiting
    # for their commit (the fourth gave up and took its delivery back off the list)
    queued(client, 4)
    for i in range(4):
        client.hset(UNACKED, f"tag-{i}", "[]")
        client.zadd(UNACKED_INDEX, {f"tag-{i}": 1.0})
        GROUP_ACKS.expect("r", f"p-{i}", f"tag-{i}")
    GROUP_ACKS.drop("r", "p-3", "tag-3")
    GROUP_ACKS.drop("r", "p-2", "another delivery's tag")  # names another delivery: left as it is
    writer = ShardWriter(str(tmp_path), "w", max_rows=4, max_wait=30, book=ShardBook(client))
    # When the four samples are committed as one group
    for future in [writer.submit("r", sample(i)) for i in range(4)]:
        future.result(timeout=10)
    writer.close()
    # Then the three waiting tasks' messages are acknowledged with the done marks, the fourth is not
    assert client.hkeys(UNACKED) == [b"tag-3"] and client.zrange(UNACKED_INDEX, 0, -1) == [b"tag-3"]
    assert GROUP_ACKS.claim("r", [f"p-{i}" for i in range(4)]) == []


def test_a_failed_write_leaves_no_entry_and_the_retry_names_the_linked_shard(client, tmp_path):
    # Given a writer whose storage refuses writes, holding two samples, one then withdrawn
    ledger = queued(client, 2)
    writer = ShardWriter(str(tmp_path), "w", max_rows=1000, max_wait=0.05, retry_base=0.05, retry_max=0.2,
                         book=ShardBook(client))
    aside = break_storage(tmp_path)
    kept, withdrawn = writer.submit("r", sample(0)), writer.submit("r", sample(1))
    wait_until(lambda: writer.storage.failures >= 2, 10, "two failed writes", poll=0.02)
    wait_until(lambda: writer.withdraw(withdrawn), 10, "the sample withdrawn", poll=0.02)  # between two tries
    # Then the failed writes left no entry for the withdrawn sample
    assert client.hget(RunKeys("r").writing, "p-1") is None
    # When storage is back, the kept sample is done in the shard actually linked
    repair_storage(tmp_path, aside)
    path = Path(kept.result(timeout=10))
    writer.close()
    assert path.exists() and ledger.entries(["p-0", "p-1"]) == [Entry("done", shard=shard_code(path)),
                                                                 Entry("queued", call="")]
    assert not client.exists(RunKeys("r").writing)


def test_a_delivery_finds_a_sample_its_entry_points_to_and_only_then(client, tmp_path):
    # Given a shard holding p-0, linked by a worker that died before marking it done, and
    # entries for p-0 (that shard), p-1 (the same shard, which lacks it), p-2 (a shard never linked)
    ledger = queued(client, 3)
    writer = ShardWriter(str(tmp_path), "w", max_rows=1, max_wait=30)  # files only
    shard = Path(writer.submit("r", dataclasses.replace(sample(0), output_len=2)).result(timeout=10))
    writer.close()
    ledger.writing(["p-0", "p-1"], shard.name)
    ledger.writing(["p-2"], "part-never-linked.parquet")

    # When each is delivered again
    outcomes = [reconciled(ledger, str(tmp_path), pid, ledger.intake(pid)[1]) for pid in ("p-0", "p-1", "p-2")]

    # Then p-0 is done in that shard, without a generation; the others are to be generated
    assert outcomes[0] == f"reconciled: {shard}" and outcomes[1:] == [None, None]
    assert ledger.entries(["p-0"]) == [Entry("done", shard=shard_code(shard))]
    assert ledger.states(["p-1", "p-2"]) == ["queued", "queued"]
    assert ledger.tally().output_tokens == 2 and not client.exists(RunKeys("r").writing)
    assert pq.read_table(shard).column("id").to_pylist() == ["p-0"]


def test_an_entry_that_is_not_a_final_shard_name_is_never_read(client, tmp_path):
    ledger = queued(client, 1)
    (tmp_path / "r").mkdir()
    for name in ("../escape.parquet", ".tmp-part-x.parquet"):
        ledger.writing(["p-0"], name)
        assert reconciled(ledger, str(tmp_path), "p-0", name) is None
    assert ledger.state("p-0") == "queued" and not client.exists(RunKeys("r").writing)


def test_a_judged_sample_is_counted_by_its_verdict_once_whether_its_group_was_marked_or_it_was_found(client, tmp_path):
    # Given three queued prompts of a run with a verifier: two samples committed by a writer with the
    # book (one passed, one failed), and one whose worker died after linking its shard (an error)
    ledger = queued(client, 3)
    writer = ShardWriter(str(tmp_path), "w", max_rows=2, max_wait=30, book=ShardBook(client))
    futures = [writer.submit("r", dataclasses.replace(sample(0), verified=True, verdict="same")),
               writer.submit("r", dataclasses.replace(sample(1), verified=False, verdict="differs"))]
    [f.result(timeout=10) for f in futures]
    writer.close()
    files_only = ShardWriter(str(tmp_path), "w2", max_rows=1, max_wait=30)
    shard = Path(files_only.submit("r", dataclasses.replace(sample(2), verified=False,
                                                            verdict="error: timeout after 10s")).result(timeout=10))
    files_only.close()
    ledger.writing(["p-2"], shard.name)

    # When the third is delivered again and found in its shard, and the first group is marked done again
    assert reconciled(ledger, str(tmp_path), "p-2", ledger.intake("p-2")[1]) == f"reconciled: {shard}"
    ledger.mark_group_done([("p-0", 2, "pass"), ("p-1", 2, "fail")], "part-again.parquet")

    # Then each is counted once, by its verdict's class
    assert ledger.tally().verdicts == {"pass": 1, "fail": 1, "error": 1}


def _samples_run(client, n: int) -> Ledger:
    """A run of 3 samples a prompt (its spec says so) with samples 0..n-1 of p-0 queued."""
    from contract.run.spec import RunSpec, save_spec

    save_spec(client, RunSpec(name="r", tokenizer="t", tokenizer_fingerprint="t", template_fingerprint="g",
                              sampling={}, thinking="prompt", think_start_id=1, think_end_id=2, stop_ids=[1],
                              samples=3))
    ledger = Ledger(client, "r")
    ledger.enqueue({f"p-0~{n}": pack_ids([1, 2, 3]) for n in range(n)})
    return ledger


def test_a_group_of_samples_of_one_prompt_is_marked_done_sample_by_sample(client, tmp_path):
    # Given samples 0-2 of one prompt in a run of 3 samples a prompt, each a row with the prompt's id
    ledger = _samples_run(client, 3)
    writer = ShardWriter(str(tmp_path), "w", max_rows=3, max_wait=30, book=ShardBook(client))

    # When the three rows (same id, samples 0, 1, 2) are committed as one group
    paths = {f.result(timeout=10) for f in [writer.submit("r", sample(0, sample=n)) for n in range(3)]}
    writer.close()

    # Then each sample's key is done in that shard, once, and no entry is left
    code = shard_code(paths.pop())
    assert ledger.entries([f"p-0~{n}" for n in range(3)]) == [Entry("done", shard=code)] * 3
    assert ledger.tally().done == 3 and not client.exists(RunKeys("r").writing)


def test_a_delivery_finds_its_sample_by_id_and_index_and_not_a_sibling(client, tmp_path):
    # Given a shard holding sample 1 of p-0, linked by a worker that died before marking it done,
    # and entries naming that shard for samples 1 and 2 (which the shard lacks)
    ledger = _samples_run(client, 3)
    writer = ShardWriter(str(tmp_path), "w", max_rows=1, max_wait=30)  # files only
    shard = Path(writer.submit("r", sample(0, sample=1)).result(timeout=10))
    writer.close()
    ledger.writing(["p-0~1", "p-0~2"], shard.name)

    # When each is delivered again
    found = [reconciled(ledger, str(tmp_path), key, ledger.intake(key)[1], samples=3) for key in ("p-0~1", "p-0~2")]

    # Then sample 1 is done in that shard without a generation, and sample 2 is to be generated
    assert found[0] == f"reconciled: {shard}" and found[1] is None
    assert ledger.states(["p-0~0", "p-0~1", "p-0~2"]) == ["queued", "done", "queued"]
