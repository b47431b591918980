"""Specification: a run with a verifier (`enqueue --verify`), against a real redis-server: its
lines' fields kept for workers, its samples counted by verdict once each, `status`'s figures,
and `export --verified-only`."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from contract.ledger.codec import pack_ids
from contract.ledger.ledger import Ledger, Tally
from contract.run.line_fields import LineFields
from contract.storage.schema import Sample, samples_to_table
from contract.run.spec import RunSpec
from producer.enqueue import _enqueue
from producer.export import export_run
from producer.prompts import parse_line
from producer.status import verification

RUN = "r"


def spec(verify: str | None = "exact") -> RunSpec:
    return RunSpec(name=RUN, tokenizer="t", tokenizer_fingerprint="t", template_fingerprint="t",
                   sampling={"max_new_tokens": 8}, thinking="prompt", think_start_id=1, think_end_id=2, stop_ids=[3],
                   verify=verify, line_fields=verify is not None)


def sample(prompt_id: str, verified: bool | None, verdict: str | None) -> Sample:
    now = datetime.now(timezone.utc)
    return Sample(id=prompt_id, input_ids=[1, 2, 3, 4], prompt_len=2, output_len=2, finish_reason="stop",
                  stop_token=3, think_end_index=2, run=RUN, server="s", model="m", max_new_tokens=8,
                  temperature=0.6, top_p=0.95, attempts=1, worker="w", tokenizer_fingerprint="t",
                  template_fingerprint="t", e2e_latency=0.1, started_at=now, finished_at=now,
                  verified=verified, verdict=verdict)


def test_a_lines_own_fields_are_everything_but_its_conversation():
    line = parse_line(json.dumps({"id": "q1", "prompt": "1/2 as a decimal?", "answer": "0.5", "level": 2,
                                  "sampling": {"temperature": 0}}).encode(), 1)
    assert line.fields == {"id": "q1", "answer": "0.5", "level": 2}


def test_enqueue_records_each_lines_fields_with_its_prompt_and_a_repeated_id_keeps_the_first(client):
    # Given a run with a verifier, and three lines, the third repeating the first's id with another answer
    lines = [parse_line(json.dumps({"id": i, "prompt": "?", "answer": a}).encode(), n)
             for n, (i, a) in enumerate([("q1", "1"), ("q2", "2"), ("q1", "other")], start=1)]
    ledger = Ledger(client, RUN)

    # When they are enqueued (in two calls, as two batches would be)
    first = _enqueue(ledger, spec(), [(lines[0], [5, 6]), (lines[1], [5, 7])], "c1")
    again = _enqueue(ledger, spec(), [(lines[2], [5, 6])], "c1")

    # Then both prompts are queued with their line's fields, and the repeat changed nothing
    assert first == [["new"], ["new"]] and again == [["again"]]
    fields = LineFields(client, RUN)
    assert fields.get("q1")["fields"]["answer"] == "1" and fields.get("q2")["fields"]["answer"] == "2"


def test_a_run_without_a_verifier_keeps_no_fields(client):
    line = parse_line(json.dumps({"id": "q1", "prompt": "?", "answer": "1"}).encode(), 1)
    assert _enqueue(Ledger(client, RUN), spec(None), [(line, [5])], "c1") == [["new"]]
    assert LineFields(client, RUN).get("q1") == {}


def test_each_stored_sample_is_counted_by_verdict_once_however_often_it_is_marked_done(client):
    # Given four queued prompts
    ledger = Ledger(client, RUN)
    ledger.enqueue({p: pack_ids([1]) for p in ("a", "b", "c", "d")}, 1)

    # When their group is marked done (and again, as a retried commit or a failover's reassertion does)
    group = [("a", 2, "pass"), ("b", 2, "fail"), ("c", 2, "error"), ("d", 2, "pass")]
    ledger.mark_group_done(group, "part-1.parquet")
    ledger.mark_group_done(group, "part-2.parquet")
    ledger.mark_done("a", 2, "part-3.parquet", verdict="pass")

    # Then each counts once, by its class, and status reads the pass rate and the samples spent per pass
    tally = ledger.tally()
    assert tally.verdicts == {"error": 1, "fail": 1, "pass": 2} and tally.done == 4
    assert verification(spec(), tally) == {"verifier": "exact", "passed": 2, "failed": 1, "error": 1,
                                           "checked": 4, "pass_rate": 0.5, "samples_per_verified": 2.0}


def test_a_run_whose_samples_are_not_checked_yet_has_no_pass_rate():
    figures = verification(spec(), Tally())
    assert (figures["checked"], figures["pass_rate"], figures["samples_per_verified"]) == (0, None, None)


@pytest.fixture
def judged(client, tmp_path) -> Path:
    """A shard of five done samples: two passed, one failed, one error, one never checked; and a
    passing copy of a prompt that is done in another shard."""
    ledger = Ledger(client, RUN)
    ledger.enqueue({f"p{i}": pack_ids([1]) for i in range(5)}, 1)
    out = tmp_path / "shards"
    (out / RUN).mkdir(parents=True)
    rows = [sample("p0", True, "pass"), sample("p1", True, "right"), sample("p2", False, "fail"),
            sample("p3", False, "error: timeout after 10s"), sample("p4", None, None)]
    pq.write_table(samples_to_table(rows), out / RUN / "part-a.parquet")
    pq.write_table(samples_to_table([sample("p2", True, "pass")]), out / RUN / "part-b.parquet")
    ledger.mark_group_done([(r.id, 2) for r in rows], out / RUN / "part-a.parquet")
    return out


@pytest.mark.parametrize("index_only", [False, True])
def test_export_verified_only_keeps_the_passing_samples_and_counts_the_others_by_verdict(
        client, judged, tmp_path, index_only):
    # When the run is exported with --verified-only
    manifest = export_run(spec(), client, str(judged), tmp_path / "dest", verified_only=True, index_only=index_only)

    # Then only the canonical samples that passed are there (a passing duplicate does not stand in)
    files = sorted(str(p) for p in (tmp_path / "dest").glob("*.parquet"))
    ids = sorted(pads.dataset(files, format="parquet").to_table(columns=["id"]).column("id").to_pylist())
    assert ids == ["p0", "p1"] and manifest["rows"] == 2 and manifest["verified_only"]
    # and the others are counted by their verdict's class
    assert manifest["left_out"] == {"verdict:error": 1, "verdict:fail": 1, "verdict:none": 1}
    assert manifest["duplicates_dropped"] == 1


def test_without_verified_only_every_done_sample_is_exported_with_its_verdict(client, judged, tmp_path):
    manifest = export_run(spec(), client, str(judged), tmp_path / "dest")
    files = sorted(str(p) for p in (tmp_path / "dest").glob("*.parquet"))
    rows = pads.dataset(files, format="parquet").to_table(columns=["id", "verified", "verdict"]).to_pylist()
    assert manifest["rows"] == 5 and manifest["left_out"] == {}
    assert {r["id"]: (r["verified"], r["verdict"]) for r in rows}["p3"] == (False, "error: timeout after 10s")


def test_a_sample_row_without_verdicts_reads_as_nulls():
    table = samples_to_table([sample("p", None, None)])
    assert table.column("verified").to_pylist() == [None] and table.column("verdict").to_pylist() == [None]


@pytest.mark.parametrize("name,says", [
    ("maths", "names no verifier"), ("regex:[", "not a regular expression"),
    ("no_such_checks_module:grade", "cannot import grade from no_such_checks_module")])
def test_enqueue_refuses_a_verifier_it_cannot_run_in_one_line_before_anything_is_queued(server, client, tmp_path,
                                                                                       name, says):
    from typer.testing import CliRunner

    from contract.keys import RUNS
    from producer.cli import app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "What is 2+2?", "answer": "4"}\n')
    result = CliRunner().invoke(app, ["enqueue", str(prompts), "--verify", name],
                                env={"REDIS_URL": server, "COLUMNS": "300"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and says in lines[0], result.output
    assert not client.exists(RUNS)


def test_enqueue_refuses_a_verifier_for_a_run_of_conversations(server, client, tmp_path):
    from typer.testing import CliRunner

    from producer.cli import app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "What is 2+2?", "answer": "4"}\n')
    result = CliRunner().invoke(app, ["enqueue", str(prompts), "--verify", "exact", "--turns", "all"],
                                env={"REDIS_URL": server, "COLUMNS": "300"})
    assert result.exit_code == 2 and "does not go with --turns all" in result.output
