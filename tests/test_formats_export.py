"""`export --format` on a real run (Redis, a worker, the stand-in, the producer's CLI), and the
exports fed through the trainers' own loading code (scripts/check_trainers.py) when a Python
with SpecForge and speculators is at hand (`scripts/trainers-venv.sh`)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis

from contract.ledger.codec import pack_ids
from contract.ledger.ledger import Ledger
from contract.storage.schema import samples_to_table
from contract.chat.bundled import bundled_tokenizer_dir
from contract.chat.template import ChatTokenizer
from producer.export import export_run
from specs.test_formats import RUN, sample, spec

from conftest import ROOT, messages_of, varied_prompts, write_prompts

FORMATS = {"specforge": "specforge.jsonl", "speculators": "speculators.jsonl"}
TRAINERS_PYTHON = Path(os.environ.get("TRAINERS_PYTHON", ROOT / ".trainers" / "bin" / "python"))


def _finished_run(fleet, tmp_path) -> tuple[dict, Path]:
    """Given a run of 24 prompts in the three input forms, stored by a worker against the stand-in:
    its rows by id, and the input file."""
    _, url = fleet.standin("--output-len-max", "96")
    fleet.worker("w1", [url])
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(24))
    fleet.producer("enqueue", str(prompts), "--max-new-tokens", "200")
    assert fleet.wait_finished() == {"done": 24}
    return {r["id"]: r for r in fleet.rows()}, prompts


def test_each_format_export_holds_the_shards_ids_and_a_mask_of_exactly_the_generated_tokens(fleet, tmp_path):
    rows, prompts = _finished_run(fleet, tmp_path)
    # When the run is exported in each trainer's format by the CLI
    for name, file in FORMATS.items():
        result = fleet.producer("export", str(tmp_path / name), "--format", name)
        assert f"format {name}: 24 rows" in result.stdout
        # Then its file holds each stored id once: the shard's ids, 0 on the prompt, 1 on the output
        exported = [json.loads(line) for line in (tmp_path / name / file).read_text().splitlines()]
        assert sorted(r["id"] for r in exported) == sorted(rows)
        for record in exported:
            stored = rows[record["id"]]
            assert record["input_ids"] == stored["input_ids"]
            assert record["loss_mask"] == [0] * stored["prompt_len"] + [1] * stored["output_len"]
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert manifest["format"]["generated_tokens"] == sum(r["output_len"] for r in rows.values())
    # And the text form decodes each answer after the messages as given
    fleet.producer("export", str(tmp_path / "text"), "--format", "text", "--prompts", str(prompts))
    given = {r["id"]: messages_of(r) for r in varied_prompts(24)}
    for line in (tmp_path / "text" / "messages.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["messages"][:-1] == given[record["id"]]
        assert record["messages"][-1]["role"] == "assistant" and "reasoning_content" in record["messages"][-1]
    # And a format that is not one is refused before anything is written
    refused = fleet.producer("export", str(tmp_path / "other"), "--format", "csv", check=False)
    assert refused.returncode == 2 and not (tmp_path / "other").exists()


def _check_trainers(exports: Path) -> subprocess.CompletedProcess:
    """scripts/check_trainers.py in the trainers' venv, on the exports under `exports/<format>`."""
    return subprocess.run([str(TRAINERS_PYTHON), str(ROOT / "scripts" / "check_trainers.py"),
                           "--parquet", str(exports / "parquet"), "--specforge", str(exports / "specforge"),
                           "--speculators", str(exports / "speculators"), "--model", str(bundled_tokenizer_dir())],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.xdist_group("trainers")  # one trainers venv, torch loaded once at a time
@pytest.mark.skipif(not TRAINERS_PYTHON.exists(),
                    reason=f"no Python with SpecForge 0.2.0 and speculators 0.9.0 at {TRAINERS_PYTHON} "
                           f"(build it with scripts/trainers-venv.sh, or set TRAINERS_PYTHON)")
def test_the_trainers_own_loaders_yield_the_exported_ids_and_masks_token_for_token(fleet, tmp_path):
    _finished_run(fleet, tmp_path)
    for name in ("parquet", *FORMATS):
        fleet.producer("export", str(tmp_path / name), "--format", name)
    result = _check_trainers(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "24 rows yielded, 24 equal token for token" in result.stdout
    assert "ArrowDataset: 24 rows, 24 equal token for token" in result.stdout


@pytest.mark.xdist_group("trainers")  # one trainers venv, torch loaded once at a time
@pytest.mark.skipif(not TRAINERS_PYTHON.exists(),
                    reason=f"no Python with SpecForge 0.2.0 and speculators 0.9.0 at {TRAINERS_PYTHON} "
                           f"(build it with scripts/trainers-venv.sh, or set TRAINERS_PYTHON)")
def test_the_trainers_read_conversation_turns_as_rows_and_drop_a_row_with_nothing_generated(redis_server, tmp_path):
    # Given shards holding a three-turn conversation (each turn's prompt holds the history before it),
    # two single prompts and one row with no generated token, all marked done in the ledger
    chat = ChatTokenizer("bundled")
    client = redis.Redis.from_url(redis_server)
    history: list[dict] = []
    rows = []
    for turn, question in enumerate(["Hello", "Why?", "And then?"]):
        history.append({"role": "user", "content": question})
        prompt = chat.render_one(history)
        answer = f"Answer {turn}."
        output = chat.tok.encode("Hmm.", add_special_tokens=False) + [128822] + \
            chat.tok.encode(answer, add_special_tokens=False) + [1]
        rows.append(sample(f"c#{turn}", prompt, output, "c", turn))
        history.append({"role": "assistant", "content": answer})
    rows += [sample(f"p{i}", chat.render_one([{"role": "user", "content": f"Q{i}"}]), [20 + i, 128822, 30, 1])
             for i in range(2)]
    rows.append(sample("empty", chat.render_one([{"role": "user", "content": "Nothing"}]), []))
    ledger = Ledger(client, RUN)
    ledger.enqueue({r.id: pack_ids(r.input_ids[:r.prompt_len]) for r in rows}, 1)
    shards = tmp_path / "shards" / RUN
    shards.mkdir(parents=True)
    pq.write_table(samples_to_table(rows), shards / "part-a.parquet")
    for r in rows:
        ledger.mark_done(r.id, r.output_len, shards / "part-a.parquet")
    # When the run is exported in each format and fed to the trainers' loaders
    for name in ("parquet", *FORMATS):
        export_run(spec(chat), client, str(tmp_path / "shards"), tmp_path / name, format=name)
    result = _check_trainers(tmp_path)
    # Then each turn is a row they read token for token, and the empty row is the one they drop
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 rows yielded, 5 equal token for token" in result.stdout
    assert "ArrowDataset: 5 rows, 5 equal token for token" in result.stdout
    assert "1 rows without a generated token dropped" in result.stdout
