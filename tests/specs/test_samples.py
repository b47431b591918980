"""Specification: several samples of each prompt (`enqueue --samples N`), in this process
against a real redis-server: what enqueue records and publishes, the seed each request
carries, how a dead sample is named, listed and replayed, and how export keeps every
(id, sample) once. The whole path through real workers is tests/test_samples.py.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from contract.ledger.codec import pack_ids, unpack_ids
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.keys import RUNS, RunKeys
from contract.ledger.ledger import Ledger
from contract.run.samples import sample_seed
from contract.storage.schema import Sample, samples_to_table
from contract.run.spec import RunSpec, load_spec
from producer.cli import app
from producer.export import export_run
from workers.intake.generation import request_sampling

QUEUE = "fleet.generate"


def cli(server: str, *args: str):
    return CliRunner().invoke(app, list(args), env={"REDIS_URL": server, "COLUMNS": "200"})


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+{i}?"}) + "\n" for i in range(3)))
    return path


def queued_keys(client) -> list[str]:
    """The prompt (ledger key) each message on the queue names (its task id is `<run>:<key>`), in queue order."""
    return [json.loads(raw)["headers"]["id"].split(":", 1)[1] for raw in client.lrange(QUEUE, 0, -1)]


def test_each_prompt_is_published_as_n_samples_each_with_its_own_ids_and_message(server, client, prompts):
    # When three prompts are enqueued with --samples 3
    result = cli(server, "enqueue", str(prompts), "--samples", "3")

    # Then the run takes 3 samples a prompt, and the ledger holds 9 queued samples, keyed <id>~<index>,
    # each with its own copy of its prompt's ids, and 9 messages name them
    assert result.exit_code == 0, result.output
    assert "9 samples of 3 prompts published" in result.output
    assert load_spec(client, "default").samples == 3
    keys = [f"q{i}~{n}" for i in range(3) for n in range(3)]
    assert Ledger(client, "default").states(keys) == ["queued"] * 9
    assert sorted(queued_keys(client)) == sorted(keys)
    ids = client.hgetall(RunKeys("default").token_ids)
    assert sorted(k.decode() for k in ids) == sorted(keys)
    assert unpack_ids(ids[b"q1~0"]) == unpack_ids(ids[b"q1~2"])
    # and the counts say 9 samples of 3 prompts
    tally = Ledger(client, "default").tally()
    assert (tally.enqueued, tally.queued, tally.prompts) == (9, 9, 3)
    status = json.loads(cli(server, "status", "--json").output)
    assert (status["prompts"], status["samples"], status["samples_per_prompt"], status["queued"]) == (3, 9, 3, 9)
    (run,) = json.loads(cli(server, "runs", "--json").output)
    assert (run["prompts"], run["samples"], run["queued"]) == (3, 9, 9)


def test_a_rerun_publishes_only_the_samples_the_run_lacks(server, client, prompts):
    # Given a run of 2 samples a prompt, enqueued, of which one sample was lost from the ledger
    assert cli(server, "enqueue", str(prompts), "--samples", "2").exit_code == 0
    client.delete(QUEUE)
    ledger = Ledger(client, "default")
    bucket, field = ledger.locations(["q1~1"])
    client.hdel(bucket[0], field[0])

    # When the same file is enqueued again
    result = cli(server, "enqueue", str(prompts), "--samples", "2")

    # Then only that sample is published, and its prompt is not counted twice
    assert result.exit_code == 0, result.output
    assert queued_keys(client) == ["q1~1"]
    assert "1 sample of 1 prompt published" in result.output
    assert ledger.tally().prompts == 3


def test_a_run_of_one_sample_is_keyed_as_before(server, client, prompts):
    # When prompts are enqueued without --samples
    assert cli(server, "enqueue", str(prompts)).exit_code == 0

    # Then each prompt is its own key, as before samples existed, and the spec's identity is unchanged
    assert sorted(queued_keys(client)) == ["q0", "q1", "q2"]
    spec = load_spec(client, "default")
    assert spec.samples == 1 and "samples" not in spec.identity()
    status = json.loads(cli(server, "status", "--json").output)
    assert (status["prompts"], status["samples"]) == (3, 3)


def test_samples_with_turns_all_are_refused_in_one_line(server, client, prompts):
    # When --samples above 1 comes with --turns all
    result = cli(server, "enqueue", str(prompts), "--samples", "2", "--turns", "all")

    # Then enqueue refuses in one line (exit 2) and records no run
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("--samples above 1 does not go with --turns all")
    assert client.scard(RUNS) == 0


def test_another_number_of_samples_is_another_run(server, client, prompts):
    assert cli(server, "enqueue", str(prompts), "--samples", "2").exit_code == 0
    result = cli(server, "enqueue", str(prompts), "--samples", "3")
    assert result.exit_code == 2 and "samples: 2 -> 3" in result.output


def spec(samples: int = 3) -> RunSpec:
    return RunSpec(name="r", tokenizer="bundled", tokenizer_fingerprint="t", template_fingerprint="t",
                   sampling={"max_new_tokens": 8, "temperature": 0.6}, thinking="prompt", think_start_id=1,
                   think_end_id=2, stop_ids=[3], samples=samples)


def test_every_request_of_a_run_of_samples_carries_its_samples_seed():
    # A sample's request asks for the seed its run, prompt and index give (the same on any retry)
    assert request_sampling(spec(3), "q1~2", {})["sampling_seed"] == sample_seed("r", "q1", 2)
    assert request_sampling(spec(3), "q1~0", {})["sampling_seed"] != request_sampling(spec(3), "q1~1", {})["sampling_seed"]
    # and a run of one sample sends none (a server older than the key takes it), its params untouched
    assert request_sampling(spec(1), "q1", {}) == {"max_new_tokens": 8, "temperature": 0.6}
    assert request_sampling(spec(1), "q1~2", {}, max_new_tokens=99)["max_new_tokens"] == 99


def letter(key: str, samples: int) -> DeadLetter:
    return DeadLetter(id=key, run="r", reason="truncated", message="m", attempts=1, servers=[], worker="w",
                      prompt_b64="AQAAAAIAAAA=", prompt_tokens=2, sampling={"max_new_tokens": 8}).of_sample(samples)


def test_a_dead_sample_names_its_prompt_and_sample_and_is_listed_shown_and_replayed_as_itself(server, client):
    # Given a run of 3 samples a prompt whose sample 1 of q1 and sample 2 of q2 are dead
    from contract.run.spec import save_spec

    save_spec(client, spec(3))
    ledger = Ledger(client, "r")
    ledger.enqueue([(f"q{i}~{n}", pack_ids([1, 2])) for i in range(3) for n in range(3)], "c")
    for key in ("q1~1", "q2~2"):
        assert DeadLetters(client, "r").put(letter(key, 3)) == "queued"

    # When the dead letters are listed as JSON
    listed = json.loads(cli(server, "dead", "list", "--run", "r", "--json").output)

    # Then each names its prompt's id and its sample
    assert sorted((d["id"], d["sample"]) for d in listed) == [("q1", 1), ("q2", 2)]
    table = [[cell.strip() for cell in line.strip("│┃").split("│" if "│" in line else "┃")]
             for line in cli(server, "dead", "list", "--run", "r").output.splitlines() if line.startswith(("│", "┃"))]
    assert table[0][:3] == ["id", "sample", "reason"]
    assert sorted(row[:3] for row in table[1:]) == [["q1", "1", "truncated"], ["q2", "2", "truncated"]]
    # and `dead show` finds one by --sample or by its key
    assert "q1, sample 1" in cli(server, "dead", "show", "q1", "--sample", "1", "--run", "r").output
    assert "q2, sample 2" in cli(server, "dead", "show", "q2~2", "--run", "r").output

    # When the dead samples of q1 are replayed by the prompt's id
    result = cli(server, "dead", "requeue", "--run", "r", "--id", "q1", "--yes")

    # Then that sample alone is queued again, as itself
    assert result.exit_code == 0 and "requeued 1 prompt" in result.output, result.output
    assert ledger.states(["q1~1", "q2~2"]) == ["queued", "dead"]
    assert queued_keys(client) == ["q1~1"]

    # and a purge deletes the other's letter, its sample staying dead
    assert cli(server, "dead", "purge", "--run", "r", "--yes").exit_code == 0
    assert client.hlen(RunKeys("r").dead) == 0 and ledger.state("q2~2") == "dead"


def test_a_run_of_one_samples_letter_keeps_its_id_and_no_sample():
    assert (letter("q1", 1).id, letter("q1", 1).sample, letter("q1", 1).key) == ("q1", None, "q1")
    assert (letter("q1~2", 3).id, letter("q1~2", 3).sample, letter("q1~2", 3).key) == ("q1", 2, "q1~2")


def row(prompt_id: str, sample: int, copy: int = 0) -> Sample:
    now = datetime.now(timezone.utc)
    return Sample(id=prompt_id, input_ids=[1, 2, 3, copy], prompt_len=2, output_len=2, finish_reason="stop",
                  stop_token=3, think_end_index=2, run="r", server="s", model="m", max_new_tokens=8,
                  temperature=0.6, top_p=0.95, attempts=1, worker="w", tokenizer_fingerprint="t",
                  template_fingerprint="t", e2e_latency=0.1, started_at=now, finished_at=now,
                  sample=sample, seed=sample_seed("r", prompt_id, sample))


@pytest.mark.parametrize("index_only", [False, True], ids=["copied", "index"])
def test_export_keeps_every_done_sample_once_and_counts_samples_and_prompts(client, tmp_path, index_only):
    # Given a run of 3 samples a prompt whose shard holds q0's three samples, q1's sample 0 twice
    # (a redelivery) and its sample 1, whose sample 2 is dead
    from contract.run.spec import save_spec

    save_spec(client, spec(3))
    ledger = Ledger(client, "r")
    ledger.enqueue([(f"q{i}~{n}", pack_ids([1, 2])) for i in range(2) for n in range(3)], "c",
                   firsts=[n == 0 for i in range(2) for n in range(3)])
    folder = tmp_path / "shards" / "r"
    folder.mkdir(parents=True)
    rows = [row("q0", 0), row("q0", 1), row("q0", 2), row("q1", 0), row("q1", 0, copy=1), row("q1", 1)]
    pq.write_table(samples_to_table(rows), folder / "part-a.parquet")
    for key in ("q0~0", "q0~1", "q0~2", "q1~0", "q1~1"):
        ledger.mark_done(key, 2, folder / "part-a.parquet")
    DeadLetters(client, "r").put(letter("q1~2", 3))

    # When the run is exported
    manifest = export_run(spec(3), client, str(tmp_path / "shards"), tmp_path / "dest", index_only=index_only)

    # Then every done (id, sample) is there once, and the manifest counts 5 samples of 2 prompts
    assert (manifest["rows"], manifest["prompts"], manifest["samples_per_prompt"]) == (5, 2, 3)
    assert manifest["duplicates_dropped"] == 1
    if not index_only:
        files = sorted(str(p) for p in (tmp_path / "dest").glob("part-*.parquet"))
        got = pads.dataset(files, format="parquet").to_table().to_pylist()
        assert sorted((r["id"], r["sample"]) for r in got) == [("q0", 0), ("q0", 1), ("q0", 2), ("q1", 0), ("q1", 1)]
        assert all(r["seed"] == sample_seed("r", r["id"], r["sample"]) for r in got)
        assert next(r for r in got if (r["id"], r["sample"]) == ("q1", 0))["input_ids"][-1] == 0  # the first copy


def test_a_shard_row_keeps_the_prompts_id_and_adds_sample_and_seed_after_the_older_columns():
    from contract.storage.schema import COLUMNS, arrow_schema

    # (columns only ever come at the end: sample and seed follow every column before samples existed)
    assert COLUMNS.index("sample") > COLUMNS.index("cached_tokens")
    assert COLUMNS.index("seed") == COLUMNS.index("sample") + 1
    assert str(arrow_schema().field("sample").type) == "int32" and str(arrow_schema().field("seed").type) == "int64"


def test_the_standin_draws_a_samples_answer_with_its_seed_only_when_asked():
    from sglang_standin.cli import parse_config
    from sglang_standin.outputs import for_seed, generate_output

    ids = list(range(100, 300))
    seeded, plain = parse_config(["--port", "1", "--seeded-outputs"]), parse_config(["--port", "1"])
    # With --seeded-outputs the samples of one prompt differ, and one seed always gives one answer
    answers = [generate_output(ids, 4096, for_seed(seeded, seed))[0] for seed in (1, 2, 3, 1)]
    assert answers[0] == answers[3] and len({tuple(a) for a in answers}) == 3
    # without it (the default, which tests compare answers with) the answer is the prompt's alone
    assert generate_output(ids, 4096, for_seed(plain, 1))[0] == generate_output(ids, 4096, plain)[0]


def test_the_samples_of_a_group_of_prompts_are_published_interleaved():
    from contract.broker.publish import SPREAD, spread

    # Given new samples of SPREAD + 2 prompts, 3 each, in the order the ledger took them
    prompts = [f"q{i}" for i in range(SPREAD + 2)]
    messages = [(f"{p}~{n}", 5, None) for p in prompts for n in range(3)]

    # When they are ordered for publishing
    ordered = [key for key, _, _ in spread(messages, 3)]

    # Then each group of SPREAD prompts goes sample 0 of each, then 1 of each, then 2 of each, every key once
    group = prompts[:SPREAD]
    assert ordered[:3 * SPREAD] == [f"{p}~{n}" for n in range(3) for p in group]
    assert ordered[3 * SPREAD:] == [f"{p}~{n}" for n in range(3) for p in prompts[SPREAD:]]
    assert sorted(ordered) == sorted(key for key, _, _ in messages)
