"""Bad input is reported line by line; a re-run publishes only what the run lacks."""
from __future__ import annotations

import json

from conftest import varied_prompts, write_prompts

BAD_LINES = [
    (b"{not json", "invalid JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
    (b'{"id": "x1", "text": "no messages"}', 'no "messages"'),
    (b'{"id": "x2", "messages": [{"role": "", "content": "hi"}]}', "empty or missing"),
    (b'{"id": "x3", "messages": [{"role": "wizard", "content": "hi"}]}', "unknown role"),
    (b'{"id": "x4", "messages": [{"role": "user", "content": 42}]}', "content is not a string"),
    (b'{"id": "x5", "prompt": "caf\xe9"}', "invalid UTF-8"),
    (b'{"id": "x6", "messages": []}', "non-empty list"),
]


def test_each_malformed_line_is_reported_and_the_valid_ones_go_through(fleet, tmp_path):
    # Given a file mixing valid prompts with every kind of malformed line
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    valid = [json.dumps(r).encode() for r in varied_prompts(6)]
    lines = [valid[0], *(bad for bad, _ in BAD_LINES), *valid[1:]]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    # When it is enqueued
    result = fleet.producer("enqueue", str(path), check=False)

    # Then each bad line is reported with its number and reason, and enqueue exits 1
    assert result.returncode == 1
    for number, (_, reason) in enumerate(BAD_LINES, start=2):
        assert f"line {number}: " in result.stderr and reason in result.stderr, (number, reason)
    # and the valid prompts are all stored
    assert fleet.wait_finished() == {"done": 6}
    assert len(fleet.rows()) == 6


def test_a_prompt_over_the_token_limit_is_reported_at_enqueue_not_truncated(fleet, tmp_path):
    # Given a short and a long prompt, and a limit between them
    records = [{"id": "short", "prompt": "Hi"}, {"id": "long", "prompt": "word " * 300}]

    # When they are enqueued with --max-prompt-tokens
    result = fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)),
                            "--max-prompt-tokens", "100", check=False)

    # Then the long one is reported and not published; the short one is
    assert result.returncode == 1
    assert "prompt_too_long" in result.stderr and "(id long)" in result.stderr
    status = json.loads(fleet.producer("status", "--json").stdout)
    assert status["prompts"] == 1


def test_a_rerun_publishes_only_new_prompts_and_duplicates_once(fleet, tmp_path):
    # Given a run that has stored 30 prompts
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    first = varied_prompts(30)
    path = write_prompts(tmp_path / "p.jsonl", first)
    fleet.producer("enqueue", str(path))
    fleet.wait_finished()

    # When the same file, grown by 10 prompts and a line repeating an id, is enqueued again
    more = varied_prompts(40)[30:] + [{"id": "p-0035", "prompt": "a different prompt, same id"}]
    write_prompts(path, first + more)
    result = fleet.producer("enqueue", str(path))

    # Then only the 10 new prompts are published, the duplicate is reported, and each id is stored once
    assert "duplicate id" in result.stderr and "p-0035" in result.stderr
    assert fleet.wait_finished() == {"done": 40}
    ids = [r["id"] for r in fleet.rows()]
    assert len(ids) == 40 == len(set(ids))
    status = json.loads(fleet.producer("status", "--json").stdout)
    assert status["prompts"] == 40


def test_a_run_refuses_prompts_prepared_differently(fleet, tmp_path):
    # Given a run enqueued with one budget
    path = write_prompts(tmp_path / "p.jsonl", varied_prompts(3))
    fleet.producer("enqueue", str(path), "--max-new-tokens", "1000")

    # When more prompts are enqueued into it with other sampling parameters
    result = fleet.producer("enqueue", str(path), "--max-new-tokens", "2000", check=False)

    # Then it is refused with what differs and how to start a new run; a new run is accepted
    assert result.returncode == 2
    assert "sampling" in result.stderr and "--run" in result.stderr
    fleet.producer("enqueue", str(path), "--max-new-tokens", "2000", "--run", "second")


def test_enqueue_holds_back_while_the_queue_is_deep(fleet, tmp_path):
    # Given a slow server and a bound on the queue far below the file's size
    _, url = fleet.standin("--step-base", "0.01", "--max-running-requests", "32")
    fleet.worker("w1", [url], FLEET_MAX_INFLIGHT_PER_SERVER="32")
    records = varied_prompts(300)

    # When the file is enqueued
    result = fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--max-queued", "50")

    # Then enqueue waited for the queue to drain rather than pile every prompt into Redis
    assert "held back" in result.stdout
    assert fleet.wait_finished(timeout=300) == {"done": 300}
