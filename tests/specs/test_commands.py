"""Specs of the commands' pure parts: visible text, a run's shard home, its own counts, the help."""
from __future__ import annotations

import io
import re

import pytest
from typer.testing import CliRunner

from contract.storage.shard_home import Shortfall, check_found, home, record, recorded
from producer.cli import app
from producer.prompts import read_prompts
from producer.status import in_flight_of
from producer.visible import visible

TITLE_AND_CLEAR = "hello \x1b]0;PWNED\x07 world \x1b[2J"


def test_control_characters_are_shown_as_escapes_and_nothing_else_changes():
    # Given text holding a title-setting and a screen-clearing sequence, C1, DEL and a bidi override
    text = TITLE_AND_CLEAR + " \x9b31m \x7f \u202eevil\u202c é 数学 😀"

    # When it is made visible
    shown = visible(text)

    # Then no control character is left raw, each is its escape, and ordinary text is untouched
    assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e]", shown)
    assert shown == ("hello \\x1b]0;PWNED\\x07 world \\x1b[2J \\x9b31m \\x7f \\u202eevil\\u202c é 数学 😀")


def test_multi_line_text_keeps_its_lines_and_tabs_but_one_line_text_does_not():
    assert visible("a\n\tb\r\x1b", lines=True) == "a\n\tb\\r\\x1b"
    assert visible("a\n\tb") == "a\\n\\tb"


def test_a_folder_home_is_absolute_and_a_bucket_is_kept(tmp_path, monkeypatch):
    # Given a worker started in some folder with OUTPUT_DIR=./shards
    monkeypatch.chdir(tmp_path)

    # Then its home names the folder from anywhere, and a bucket's stays as it is
    assert home("./shards") == str(tmp_path.resolve() / "shards")
    assert home("file:///data/traces/") == "/data/traces"
    assert home("s3://bucket/runs/") == "s3://bucket/runs"


def test_a_run_records_each_place_its_shards_were_written_once(client):
    record(client, "r", "/a")
    record(client, "r", "/a")
    record(client, "r", "s3://b/p")
    assert recorded(client, "r") == ["/a", "s3://b/p"] and recorded(client, "other") == []


def test_fewer_samples_found_than_done_is_a_shortfall_that_says_where_it_looked():
    check_found("r", done=5, found=5, where="/x/r")
    check_found("r", done=5, found=6, where="/x/r")  # a run still writing: more is fine
    with pytest.raises(Shortfall) as caught:
        check_found("r", done=284, found=0, where="/elsewhere/r")
    message = str(caught.value)
    assert "284" in message and " 0 " in message and "/elsewhere/r" in message and "\n" not in message


def test_a_runs_prompts_in_flight_are_the_ones_live_workers_hold_for_it():
    # Given two workers holding prompts of two runs (one prompt listed by both: a redelivery)
    records = [{"holding": {"a": ["1", "2"], "b": ["x"]}}, {"holding": {"a": ["2", "3"]}}, {}]

    # Then each run counts its own, at most its pending prompts
    assert in_flight_of(records, "a", pending=10) == 3
    assert in_flight_of(records, "b", pending=10) == 1
    assert in_flight_of(records, "a", pending=2) == 2  # a heartbeat older than the last stores
    assert in_flight_of(records, "c", pending=4) == 0


COMMANDS = [[], ["enqueue"], ["status"], ["runs"], ["export"], ["demo"], ["report"], ["show"], ["dead"],
            ["dead", "list"], ["dead", "show"], ["dead", "stats"], ["dead", "requeue"], ["dead", "purge"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_help_at_80_columns_names_every_option_in_full_with_one_placeholder_style(command):
    # When a command's help is asked for in an 80-column terminal
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, prog_name="python -m producer")

    # Then it shows each option's whole name, no developer note, and placeholders in capitals
    assert result.exit_code == 0, result.output
    text = result.output
    assert "…" not in text and "importing this module" not in text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert not re.search(r"\{[A-Za-z_]+\}|<str>|<int>|<float|<path>", text), text
    # and its usage line names each argument as its help does, bare: `export [OPTIONS] DEST`
    usage = text.splitlines()[0]
    arguments = re.findall(r"^  ([A-Z][A-Z_]*)  ", text.split("Arguments:")[1], re.M) if "Arguments:" in text else []
    assert usage.split("[OPTIONS]")[1].split() == arguments or "COMMAND" in usage, text
    for option in re.findall(r"^\s+(--[a-z-]+)", text, re.M):
        assert not option.endswith("-"), option


def test_version_and_json_are_described():
    version = CliRunner().invoke(app, ["--version"])
    assert version.exit_code == 0 and re.fullmatch(r"reasoning-fleet \d+\.\d+\.\S+\n", version.output)
    for command in (["status"], ["runs"], ["dead", "list"], ["dead", "show"], ["dead", "stats"]):
        text = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"}).output
        assert re.search(r"--json\s+\S", text), command


@pytest.mark.parametrize("args, valid", [
    (["enqueue", "x.jsonl", "--thinking", "maybe"], "auto, prompt, output, off"),
    (["enqueue", "x.jsonl", "--turns", "some"], "last, all"),
    (["enqueue", "x.jsonl", "--disable-rule", "nope"], "truncated"),
    (["export", "out", "--format", "csv"], "parquet, specforge, speculators, text"),
    (["dead", "list", "--reason", "bogus"], "truncated, token_count_mismatch"),
    (["dead", "requeue", "--reason", "truncted"], "truncated"),
    (["dead", "purge", "--reason", "x"], "poison"),
])
def test_an_option_with_fixed_values_refuses_another_and_lists_the_valid_ones(args, valid, tmp_path, monkeypatch):
    # Given a prompt file, and a REDIS_URL naming a closed port
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text('{"prompt": "hi"}\n')

    # When a command is given a value outside its option's set
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80", "REDIS_URL": "redis://127.0.0.1:1/0"})

    # Then it is refused before Redis is reached (exit 2, not "cannot use Redis"), naming the valid values
    assert result.exit_code == 2, result.output
    assert "is not one of" in result.output and valid in result.output.replace("\n", " ")


def test_a_json_error_names_its_line_and_its_column_in_characters():
    # Given a file whose second line has a comma missing after text with two-byte and three-byte characters
    lines = b'{"prompt": "ok"}\n' + '{"id": "b", "prompt": "café 数" x}\n'.encode()

    # When it is read
    (_, bad) = list(read_prompts(io.BytesIO(lines)))

    # Then the report names line 2, and the column an editor shows (characters, from 1)
    assert (bad.line, bad.reason) == (2, "invalid JSON: Expecting ',' delimiter (column 32)")


def test_the_console_script_reasoning_fleet_is_python_m_producer_under_its_own_name():
    import subprocess
    import sys
    from importlib.metadata import entry_points
    from pathlib import Path

    from producer.cli import main

    # Given the installed package, then its console script runs the CLI's entry point
    [script] = entry_points(group="console_scripts", name="reasoning-fleet")
    assert script.load() is main
    # and `reasoning-fleet export --help` reads as `python -m producer export --help`, under its name
    done = subprocess.run([str(Path(sys.executable).parent / "reasoning-fleet"), "export", "--help"],
                          capture_output=True, text=True, env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: reasoning-fleet export [OPTIONS] DEST\n"), done.stdout


def test_show_of_a_dead_letter_writes_its_sampling_as_settings_not_a_python_dict():
    from contract.ledger.deadletters import DeadLetter
    from contract.run.spec import RunSpec
    from producer.show import letter_view

    # Given a dead letter of a truncated answer, with its sampling and its finish reason
    spec = RunSpec(name="r", tokenizer="t", tokenizer_fingerprint="t", template_fingerprint="t",
                   sampling={"max_new_tokens": 8}, thinking="prompt", think_start_id=1, think_end_id=2, stop_ids=[3])
    letter = DeadLetter(id="p1", run="r", reason="truncated", message="m", attempts=1, servers=["http://s"],
                        worker="w", prompt_b64="", prompt_tokens=3,
                        sampling={"max_new_tokens": 4096, "skip_special_tokens": False, "temperature": 0.6},
                        excerpt={"output_len": 4096, "finish_reason": {"type": "length", "length": 4096},
                                 "think_end": []})

    # When `show` lays it out
    fields = dict(letter_view(letter, spec).fields)

    # Then each is `key=value`, in JSON's spelling, and an empty list reads "none"
    assert fields["sampling"] == "max_new_tokens=4096, skip_special_tokens=false, temperature=0.6"
    assert fields["excerpt finish_reason"] == "type=length, length=4096"
    assert fields["excerpt think_end"] == "none"
    assert not any(c in value for value in fields.values() for c in "{}'")
