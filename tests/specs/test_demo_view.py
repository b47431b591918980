"""Specs of what the demo prints at its end: counts in good English, and commands that run as
printed from any folder."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from rich.console import Console

from contract.counts import counted
from producer.demo_view import print_next_steps, print_result

REPORT = {"done": 1, "dead": 1, "pending": 0, "output_tokens": 10, "dead_by_reason": {"truncated": 1},
          "examples": [{"id": "ex-1", "reason": "truncated", "message": "hit max_new_tokens"}]}


def test_a_count_names_one_thing_in_the_singular_and_more_in_the_plural():
    assert [counted(n, "file") for n in (0, 1, 2, 1234)] == ["0 files", "1 file", "2 files", "1,234 files"]
    assert counted(1, "dead letter") == "1 dead letter" and counted(3, "index", "indexes") == "3 indexes"


def test_the_result_of_a_run_with_one_shard_says_1_file(tmp_path):
    # Given a run whose workers wrote one shard
    (tmp_path / "shards" / "demo").mkdir(parents=True)
    (tmp_path / "shards" / "demo" / "part-1.parquet").write_bytes(b"")
    console = Console(record=True, width=100)

    # When the demo prints its result
    print_result(REPORT, str(tmp_path / "shards"), tmp_path, 2.0, console)
    print_next_steps(REPORT, None, {}, None, tmp_path, 2.0, console)

    # Then each count reads right
    text = console.export_text()
    assert "shards: 1 file in" in text and "1 files" not in text
    assert "summary: 1 sample stored, 1 dead letter (truncated 1)" in text


def test_the_commands_to_try_next_start_with_an_absolute_interpreter(tmp_path, monkeypatch):
    # Given a demo run from inside the folder that holds its interpreter (scripts/demo.sh runs from the repository)
    monkeypatch.chdir(Path(os.sys.executable).parent)
    console = Console(record=True, width=100)

    # When it prints what to try next
    print_next_steps(REPORT, None, {"REDIS_URL": "redis://127.0.0.1:5/0"},
                     {"url": "redis://127.0.0.1:5/0", "dir": str(tmp_path), "pid": 1}, tmp_path, 2.0, console)

    # Then every command names its interpreter and paths absolutely, so it runs from any folder
    commands = [line.strip() for line in console.export_text().splitlines() if "-m producer" in line]
    assert len(commands) >= 4
    for command in commands:
        words = shlex.split(command)
        python = words[1]  # after REDIS_URL=...
        assert words[0].startswith("REDIS_URL=") and os.path.isabs(python), command
        assert all(os.path.isabs(w) for w in words if "/" in w and not w.startswith(("REDIS_URL", "redis:"))), command


def test_the_demo_and_status_say_which_window_their_tokens_per_second_are_of(tmp_path):
    from producer.status_view import rate_window

    # Given the demo's result table
    console = Console(record=True, width=120)
    print_result(REPORT, str(tmp_path), tmp_path, 2.0, console)

    # Then its tokens/s says it is of the run from enqueue to the end, and status's of the last minutes
    assert "tokens/s (output, enqueue to last prompt settled)" in console.export_text()
    assert rate_window(300) == "samples/s, tokens/s: output stored over the last 5 min"
    assert rate_window(42) == "samples/s, tokens/s: output stored over the last 42 s"
