"""A prompt that kills its server is caught: against the real SGLang server, whose every process exits on an
input id its model lacks, restarted each time it dies as a supervisor would (workers/intake/server_crashes.py)."""
from __future__ import annotations

import pytest

from conftest import write_prompts
from real_sglang import checkpoint, restart, tokenizer_with_added_tokens
from supervisor import Supervisor

pytestmark = pytest.mark.xdist_group("real-sglang-crash")  # a server that dies: a worker of its own, beside the shared ones'

ADDED = ["<tool_a>", "<tool_b>", "<tool_c>", "<tool_d>"]


BACKOFF_S = 5.0  # before the first restart, doubling after each death: Kubernetes' CrashLoopBackOff, halved


def _supervised(fleet, server) -> Supervisor:
    """The server started again on its port each time it dies, after the back-off. Once the test stops the
    supervisor, a restart still waiting is never made: the killer is a dead letter by then, and a load is
    ~19 CPU-seconds."""
    def restarted(dead):
        fleet.servers.append(new := restart(fleet.logs, dead, wait_healthy=False))
        return new

    return Supervisor(server, alive=lambda s: s.process.alive(), restart=restarted, backoff=BACKOFF_S, poll=0.5)


@pytest.mark.timeout(1500)  # four starts of a real server, each minutes on a loaded 2-core machine
def test_a_prompt_that_kills_its_server_is_dead_lettered_and_its_neighbours_are_stored(fleet, tmp_path, tokenizer):
    # Given a model resized for none of its tokenizer's four added tokens (its server's /tokenize gives their
    # ids, which the engine cannot embed), served by the real server under a supervisor, and a worker
    extended = tokenizer_with_added_tokens(tokenizer, tmp_path / "extended-tokenizer", ADDED)
    model = checkpoint("random", extended, vocab=len(tokenizer))
    supervisor = _supervised(fleet, fleet.sglang(model))
    worker = fleet.worker("w1", [supervisor.server.url])

    # When a run of eight prompts, one of which uses an added token, is enqueued with that tokenizer
    records = [{"id": f"p{i}", "prompt": f"Question {i}: count to {i + 3}."} for i in range(8)]
    records[5]["prompt"] = f"Call {ADDED[2]} now."
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--tokenizer", str(extended),
                   "--max-new-tokens", "48", "--thinking", "off", "--disable-rule", "truncated")

    # Then the killer ends as a server_crash dead letter, its record listing its crashes (server and time):
    # one among the others, then two sent alone
    try:
        states = fleet.wait_finished(timeout=1000)
    finally:
        supervisor.stop()
    letters = fleet.dead_letters()
    assert [(d["id"], d["reason"]) for d in letters] == [("p5", "server_crash")], fleet.logs_tail(60)
    crashes = letters[0]["excerpt"]["crashes"]
    assert [c["alone"] for c in crashes] == [False, True, True]
    assert {c["server"] for c in crashes} == {supervisor.server.url}
    assert all(abs(c["at"] - died) < 30 for c, died in zip(crashes, supervisor.deaths)), (crashes, supervisor.deaths)
    # and its seven neighbours, in flight beside it at the first crash, are stored, none blamed
    assert states == {"done": 7, "dead": 1}
    assert sorted(row["id"] for row in fleet.rows()) == [f"p{i}" for i in range(8) if i != 5]
    # and the server died three times: once among the others, twice when the killer was sent alone
    assert len(supervisor.deaths) == 3, supervisor.deaths
    # and the worker's log named the prompt at the first crash, at once
    assert "prompt p5 of run default was in flight on" in worker.log.read_text()
