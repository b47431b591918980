"""Export against a real redis-server (started once for this module) and shards written
here in the shard schema: each done id once, from the shard the ledger names, whether
the rows are copied (`export`) or read in place through the index (`--index-only`, here
with DuckDB, as a distributed reader would).
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from contract.ledger.codec import pack_ids
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.ledger.ledger import Ledger
from contract.storage.schema import Sample, samples_to_table
from contract.run.spec import RunSpec
from producer.export import export_run

RUN = "r"


def sample(prompt_id: str, copy: int = 0) -> Sample:
    now = datetime.now(timezone.utc)
    return Sample(id=prompt_id, input_ids=[1, 2, 3, copy], prompt_len=2, output_len=2, finish_reason="stop",
                  stop_token=3, think_end_index=2, run=RUN, server="s", model="m", max_new_tokens=8,
                  temperature=0.6, top_p=0.95, attempts=1, worker="w", tokenizer_fingerprint="t",
                  template_fingerprint="t", e2e_latency=0.1, started_at=now, finished_at=now)


def shard(folder: Path, name: str, rows: list[Sample]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(samples_to_table(rows), folder / name, compression="zstd")
    return folder / name


def spec() -> RunSpec:
    return RunSpec(name=RUN, tokenizer="t", tokenizer_fingerprint="t", template_fingerprint="t",
                   sampling={"max_new_tokens": 8}, thinking="prompt", think_start_id=1, think_end_id=2, stop_ids=[3])


@pytest.fixture
def run(client, tmp_path):
    """Shards a, b, c of a run whose ledger says: p00-p09 done in a, p10-p19 done in b, p22 done
    in c, p20 dead, p21 queued; b also holds a redelivered copy of p03, and the dead and
    queued prompts' rows; c holds p22 twice."""
    ledger = Ledger(client, RUN)
    ledger.enqueue({f"p{i:02d}": pack_ids([1, 2]) for i in range(23)}, 1)
    out = tmp_path / "shards"
    a = shard(out / RUN, "part-a.parquet", [sample(f"p{i:02d}") for i in range(10)])
    b = shard(out / RUN, "part-b.parquet", [sample(f"p{i:02d}") for i in (*range(10, 20), 3, 20, 21)])
    c = shard(out / RUN, "part-c.parquet", [sample("p22"), sample("p22", copy=1)])
    for i in range(10):
        ledger.mark_done(f"p{i:02d}", 2, a)
    for i in range(10, 20):
        ledger.mark_done(f"p{i:02d}", 2, b)
    ledger.mark_done("p03", 2, b)  # the redelivery: the first durable copy stays canonical
    ledger.mark_done("p22", 2, c)
    DeadLetters(client, RUN).put(DeadLetter(id="p20", run=RUN, reason="aborted", message="m", attempts=1,
                                            servers=[], worker="w", prompt_b64="", prompt_tokens=2, sampling={}))
    return out


DONE = {f"p{i:02d}" for i in (*range(20), 22)}


def read(dest: Path) -> list[dict]:
    files = sorted(str(p) for p in dest.glob("part-*.parquet"))
    return pads.dataset(files, format="parquet").to_table().to_pylist()


@pytest.mark.parametrize("jobs", [1, 2])
def test_export_keeps_each_done_id_once_from_the_shard_the_ledger_names(client, server, run, tmp_path, jobs):
    # When the run is exported, by one process or two
    manifest = export_run(spec(), client, str(run), tmp_path / "dest", rows_per_file=4, jobs=jobs,
                          redis_url=server)

    # Then each done id is there once, from its canonical shard's first row, and nothing else
    rows = read(tmp_path / "dest")
    assert sorted(r["id"] for r in rows) == sorted(DONE)
    assert next(r for r in rows if r["id"] == "p22")["input_ids"] == [1, 2, 3, 0]
    # and the manifest counts what was left out and why, and what each file holds
    assert (manifest["rows"], manifest["source_rows"], manifest["duplicates_dropped"]) == (21, 25, 2)
    assert manifest["left_out"] == {"dead": 1, "queued": 1} and manifest["done_not_exported"] == 0
    assert all(f["rows"] <= 4 for f in manifest["files"]) and sum(f["rows"] for f in manifest["files"]) == 21
    assert manifest["ledger"] == {"done": 21, "dead": 1, "queued": 1} and manifest["models"] == ["m"]


def test_a_reader_of_the_shards_in_place_sees_the_export_through_the_index(client, run, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    # Given the run exported, and indexed
    export_run(spec(), client, str(run), tmp_path / "dest")
    manifest = export_run(spec(), client, str(run), tmp_path / "index", index_only=True)
    assert manifest["rows"] == 21 and [f["name"] for f in manifest["files"]] == ["keep-000.parquet"]

    # When DuckDB reads the shards where they are, semi-joined with the index
    in_place = duckdb.sql(f"""
        SELECT s.id, s.input_ids
        FROM read_parquet('{run / RUN}/part-*.parquet', filename = true, file_row_number = true) s
        SEMI JOIN read_parquet('{tmp_path / "index"}/keep-*.parquet') k
          ON k.shard = parse_filename(s.filename) AND k.row = s.file_row_number AND k.id = s.id
        ORDER BY s.id""").fetchall()

    # Then it sees exactly the rows of the export
    exported = sorted((r["id"], r["input_ids"]) for r in read(tmp_path / "dest"))
    assert [(i, list(ids)) for i, ids in in_place] == exported


def test_a_shard_holding_only_canonical_rows_is_exported_without_a_byte_copied(client, run, tmp_path):
    # When the run is exported onto the shards' file system
    manifest = export_run(spec(), client, str(run), tmp_path / "dest")

    # Then shard a (all its rows canonical) is a file of the export as it is, hard-linked
    whole = [f for f in manifest["files"] if f["rows"] == 10 and
             (tmp_path / "dest" / f["name"]).stat().st_ino == (run / RUN / "part-a.parquet").stat().st_ino]
    assert len(whole) == 1 and Ledger(client, RUN).canonical_rows("part-a.parquet") == 10
    # and the others, which hold rows to leave out, are read and rewritten
    assert Ledger(client, RUN).canonical_rows("part-b.parquet") == 10 and manifest["rows"] == 21


def test_an_export_to_a_destination_that_cannot_be_written_says_so_and_reads_no_shard(client, run, tmp_path):
    # Given a run's shards, and a DEST whose parent is a file (no one, root included, can make a folder there)
    (tmp_path / "a-file").write_text("not a folder")
    dest = tmp_path / "a-file" / "export"
    read = []

    # When it is exported there
    from producer.export_folder import ExportRefused

    with pytest.raises(ExportRefused) as refused:
        export_run(spec(), client, str(run), dest, on_progress=read.append)

    # Then the refusal names the destination as not writable (not the shards), before any shard was read
    assert str(refused.value).startswith(f"{dest} is not writable: ") and "shard" not in str(refused.value)
    assert read == []


def test_complete_only_judges_each_conversation_once_so_one_completed_between_two_shards_is_left_out_whole(client):
    # Given a run's conversation of three turns, still in progress when the shard holding its first turn is read
    from contract.keys import RunKeys
    from contract.ledger.conversation_ledger import ConversationLedger
    from producer.export import _Share, _of_complete_conversations

    run = "conv-race"
    ledger = Ledger(client, run)
    ConversationLedger(client, run).register([("c", 3, [])])
    share = _Share(0, run, [], "", 10, False, complete_only=True)
    first = _of_complete_conversations(ledger, ["c#0"], [True], share)

    # When it completes (its last turn advanced: it leaves the in-progress hash) before the next shard,
    # holding its other turns, is read
    client.hdel(RunKeys(run).conversation_at, "c")
    later = _of_complete_conversations(ledger, ["c#1", "c#2"], [True, True], share)

    # Then none of its turns is exported: it is held to the verdict of its first read, never exported in part
    assert (first, later) == ([False], [False, False])
    assert share.left_out["incomplete_conversation"] == 3


def test_complete_only_leaves_out_whole_a_conversation_in_progress_when_the_shards_were_listed(client):
    # Given a run's conversation of three turns, in progress when the export listed the run's shards
    from contract.keys import RunKeys
    from contract.ledger.conversation_ledger import ConversationLedger
    from producer.export import _conversations_in_progress, _of_complete_conversations, _Share

    run = "conv-listed"
    ConversationLedger(client, run).register([("c", 3, []), ("d", 1, [])])
    client.hdel(RunKeys(run).conversation_at, "d")  # d complete before the export
    share = _Share(0, run, [], "", 10, False, complete_only=True, in_progress=_conversations_in_progress(client, run))

    # When it completes after the listing (its last turn in a shard the listing did not see), before
    # the first of its turns is read
    client.hdel(RunKeys(run).conversation_at, "c")
    kept = _of_complete_conversations(Ledger(client, run), ["c#0", "c#1", "d#0"], [True, True, True], share)

    # Then none of its turns is exported (the ones read would be all but its last), and the conversation
    # complete before the export is
    assert kept == [False, False, True]
    assert share.left_out["incomplete_conversation"] == 2
