"""What a newcomer's first `enqueue` mistakes print: one line and an exit status, never a
traceback; and which tokenizer a run used, said in the summary (against a real redis-server).
A hub id the offline cache lacks is tests/test_commands.py's: huggingface_hub reads
HF_HUB_OFFLINE once, when imported, so it needs a process started with it."""
from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from contract.keys import RUNS
from producer.cli import app

WHAT_TO_PASS = "pass --tokenizer a folder holding tokenizer.json or tokenizer_config.json, a hub id"


def enqueue(server: str, *args: str, **env: str):
    """`python -m producer enqueue ARGS` in this process, against the test's Redis."""
    return CliRunner().invoke(app, ["enqueue", *args], env={"REDIS_URL": server, "COLUMNS": "200", **env})


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "What is 2+2?"}\n')
    return path


@pytest.mark.parametrize("given", ["./no-such-dir", "/no/such/tokenizer", "~/no-such-tokenizer", "a/b/c"])
def test_a_tokenizer_path_that_is_not_there_is_one_line_at_once_without_the_hub(server, client, prompts, given):
    # Given a reachable hub address that answers nothing (were it asked, this would wait out its retries)
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://10.255.255.1"}

    # When enqueue is given a path-like tokenizer that does not exist
    started = time.monotonic()
    result = enqueue(server, str(prompts), "--tokenizer", given, **env)

    # Then it fails at once with one line naming what was asked and what to pass (exit 2), and records no run
    line = one_line(result.output)
    assert result.exit_code == 2 and time.monotonic() - started < 5
    assert line.startswith(f"tokenizer {given!r} not found: no such folder, and not a hub id") and WHAT_TO_PASS in line
    assert "Traceback" not in result.output and client.scard(RUNS) == 0


def test_a_folder_without_a_tokenizer_is_one_line(server, prompts, tmp_path):
    result = enqueue(server, str(prompts), "--tokenizer", str(tmp_path))
    line = one_line(result.output)
    assert result.exit_code == 2
    assert line.startswith(f"tokenizer folder '{tmp_path}' holds neither tokenizer.json nor tokenizer_config.json")


def test_enqueue_says_which_tokenizer_it_used_and_when_it_fell_back_to_the_bundled_one(server, prompts):
    # When a run is enqueued without --tokenizer, and another with --tokenizer bundled
    defaulted = enqueue(server, str(prompts), "--run", "first")
    named = enqueue(server, str(prompts), "--run", "second", "--tokenizer", "bundled")

    # Then both summaries name the bundled tokenizer; only the first says it was a fallback, with the hint
    assert defaulted.exit_code == 0 and named.exit_code == 0, defaulted.output + named.output
    fallback = [line for line in defaulted.output.splitlines() if line.startswith("tokenizer:")]
    assert fallback == ["tokenizer: the bundled DeepSeek tokenizer (R1-style chat template), as no --tokenizer was "
                        "given; servers of another model need --tokenizer PATH_OR_HUB_ID (their model's own), in a "
                        "new run"]
    said = [line for line in named.output.splitlines() if line.startswith("tokenizer:")]
    assert said == ["tokenizer: the bundled DeepSeek tokenizer (R1-style chat template)"]


@pytest.mark.parametrize("text", ["", "\n\n  \n\t\n"], ids=["empty", "blank lines"])
def test_a_file_without_prompts_fails_naming_the_file(server, client, tmp_path, text):
    # Given a prompt file that is empty, or holds only blank lines
    path = tmp_path / "nothing.jsonl"
    path.write_text(text)

    # When it is enqueued
    result = enqueue(server, str(path))

    # Then one line names the file and says there were no prompts (exit 1), and no run is recorded
    assert result.exit_code == 1
    assert one_line(result.output).startswith(f"no prompts in {path}: the file is empty or holds only blank lines")
    assert client.scard(RUNS) == 0


def test_a_file_of_only_malformed_lines_reports_each_line_and_fails(server, tmp_path):
    # Given a file whose every line is malformed
    path = tmp_path / "bad.jsonl"
    path.write_text('not json\n\n{"id": "x"}\n')

    # When it is enqueued
    result = enqueue(server, str(path))

    # Then each bad line is reported with its number, nothing is published, and it exits 1
    assert result.exit_code == 1
    assert "line 1: invalid JSON" in result.output and "line 3: " in result.output
    published = result.output.split("┡", 1)[1].splitlines()[1]
    assert published.strip("│ ").split()[0] == "0"


def test_a_parquet_file_is_enqueued_its_bad_rows_reported_by_row_number(server, client, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Given a Parquet file of three prompts, the middle one with no user turn
    def turn(role: str, text: str) -> list[dict]:
        return [{"role": role, "content": text}]

    rows = [{"key": "a", "q": turn("user", "What is 2+2?")}, {"key": "b", "q": turn("system", "x")},
            {"key": "c", "q": turn("user", "Name a prime.")}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")

    # When it is enqueued naming its columns
    result = enqueue(server, str(tmp_path / "p.parquet"), "--messages-column", "q", "--id-column", "key",
                     "--run", "tab")

    # Then the good rows are published, the bad one is reported by its row number, and it exits 1
    assert result.exit_code == 1, result.output
    assert "row 1: no user message\n" in result.output
    published = result.output.split("┡", 1)[1].splitlines()[1]
    assert published.strip("│ ").split()[0] == "2"


def test_a_table_without_its_named_column_is_one_line_and_records_no_run(server, client, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": "x"}]), tmp_path / "p.parquet")
    result = enqueue(server, str(tmp_path / "p.parquet"), "--messages-column", "question")
    assert result.exit_code == 2
    assert "has no column 'question' (--messages-column); its columns: text" in one_line(result.output)
    assert client.scard(RUNS) == 0
