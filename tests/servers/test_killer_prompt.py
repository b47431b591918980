"""A prompt that kills its server, against the stand-in, which exits on an input id outside its vocabulary as
SGLang 0.5.23 does (`--oov-ids crash`), restarted within a second each time it dies: the family of the real
server's crash test (tests/real/test_server_crash.py), whose restarts are minutes, run where they are cheap."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import write_prompts
from real_sglang import tokenizer_with_added_tokens
from supervisor import Supervisor

ADDED = ["<tool_a>", "<tool_b>"]


def _killable_standin(fleet, tmp_path, tokenizer, workers: int) -> tuple[Supervisor, str, Path]:
    """A tokenizer that adds two tokens, a stand-in whose vocabulary lacks them (it dies on them) started again
    at once whenever it dies (faster than a health round: the workers may never see it down), and `workers`
    workers bound to it; the supervisor, the stand-in's URL and the tokenizer's folder."""
    extended = tokenizer_with_added_tokens(tokenizer, tmp_path / "extended", ADDED)
    options = ["--tokenizer-path", str(extended), "--vocab-size", str(len(tokenizer)), "--oov-ids", "crash",
               "--step-base", "0.05", "--output-len-max", "40"]
    process, url = fleet.standin(*options)
    port = int(url.rsplit(":", 1)[1])
    supervisor = Supervisor(process, alive=lambda p: p.alive(),
                            restart=lambda _: fleet.standin(*options, port=port, wait_healthy=False)[0])
    for name in ("w1", "w2")[:workers]:
        fleet.worker(name, [url])
    return supervisor, url, extended


def _enqueue_with_killers(fleet, tmp_path, extended: Path, killers: list[int], n: int) -> None:
    """n prompts enqueued with the extended tokenizer, those at `killers` using an added token."""
    records = [{"id": f"p{i:02d}", "prompt": f"Question {i}: count to {i + 3}."} for i in range(n)]
    for i in killers:
        records[i]["prompt"] = f"Call {ADDED[i % 2]} now."
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--tokenizer", str(extended),
                   "--max-new-tokens", "48", "--thinking", "off")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
def test_a_killer_prompt_is_dead_lettered_its_neighbours_stored_and_none_blamed(fleet, tmp_path, tokenizer, workers):
    # Given a stand-in whose vocabulary lacks the two tokens a tokenizer adds, which dies on them and is started
    # again at once whenever it dies (faster than a health round: the workers may never see it down), and workers
    supervisor, url, extended = _killable_standin(fleet, tmp_path, tokenizer, workers)

    # When a run of twelve prompts, one of which uses an added token, is enqueued with that tokenizer
    _enqueue_with_killers(fleet, tmp_path, extended, killers=[5], n=12)
    try:
        states = fleet.wait_finished(timeout=240)
    finally:
        supervisor.stop()

    # Then the killer is a server_crash dead letter, convicted by two deaths while it was sent alone
    letters = fleet.dead_letters()
    assert [(d["id"], d["reason"]) for d in letters] == [("p05", "server_crash")], fleet.logs_tail(60)
    crashes = letters[0]["excerpt"]["crashes"]
    assert [c["alone"] for c in crashes][-2:] == [True, True] and {c["server"] for c in crashes} == {url}
    # and its eleven neighbours are stored, none blamed, and the server died only of the killer
    assert states == {"done": 11, "dead": 1}
    assert sorted(r["id"] for r in fleet.rows()) == [f"p{i:02d}" for i in range(12) if i != 5]
    assert len(supervisor.deaths) == len(crashes), (supervisor.deaths, crashes)


def test_two_killer_prompts_in_one_run_are_both_dead_lettered_and_their_neighbours_stored(fleet, tmp_path, tokenizer):
    # Given the stand-in that dies on the added tokens, restarted at once, and two workers
    supervisor, url, extended = _killable_standin(fleet, tmp_path, tokenizer, workers=2)

    # When a run of twelve prompts, two of which use an added token, is enqueued with that tokenizer
    _enqueue_with_killers(fleet, tmp_path, extended, killers=[3, 8], n=12)
    try:
        states = fleet.wait_finished(timeout=300)
    finally:
        supervisor.stop()

    # Then both are server_crash dead letters, each convicted by its own two deaths alone, and the ten others stored
    letters = fleet.dead_letters()
    assert sorted((d["id"], d["reason"]) for d in letters) == [("p03", "server_crash"), ("p08", "server_crash")], \
        fleet.logs_tail(60)
    for letter in letters:
        assert [c["alone"] for c in letter["excerpt"]["crashes"]][-2:] == [True, True]
    assert states == {"done": 10, "dead": 2}
    assert sorted(r["id"] for r in fleet.rows()) == [f"p{i:02d}" for i in range(12) if i not in (3, 8)]
