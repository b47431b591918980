"""The real SGLang server SIGKILLed mid-run and started again on its port: nothing lost, nothing twice,
no prompt blamed for a death that was not its own (workers/intake/server_crashes.py)."""
from __future__ import annotations

import time

import pytest

from conftest import varied_prompts, write_prompts
from real_sglang import restart
from waiting import wait_until

pytestmark = pytest.mark.xdist_group("real-sglang-restart")  # a server that dies: a worker of its own, beside the shared ones'


@pytest.mark.timeout(1500)  # four starts of a real server, each minutes on a loaded 2-core machine
def test_a_server_killed_twice_mid_run_loses_nothing_and_blames_no_prompt(fleet, tmp_path, sglang_models):
    # Given the real server with a random model, running 8 requests at a time, and a worker bound to it
    server = fleet.sglang(sglang_models["random"], "--max-running-requests", "8")
    worker = fleet.worker("w1", [server.url])

    # When a run of 24 prompts of 256 tokens each is enqueued at temperature 0
    n = 24
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--tokenizer", "bundled",
                   "--temperature", "0", "--max-new-tokens", "256", "--thinking", "off",
                   "--disable-rule", "truncated")
    # and the server's whole process group is SIGKILLed with prompts in flight, then started again, twice
    for done in (6, 14):
        wait_until(lambda: fleet.states().get("done", 0) >= done, 300, f"{done} prompts done", fleet)
        server.kill()
        time.sleep(2)
        server = restart(fleet.logs, server)
        fleet.servers.append(server)

    # Then every prompt is stored exactly once, none dead-lettered
    assert fleet.wait_finished(timeout=480) == {"done": n}
    assert fleet.dead_letters() == []
    rows = fleet.rows()
    assert sorted(row["id"] for row in rows) == sorted(p["id"] for p in varied_prompts(n))
    # and each sample is the restarted server's own answer to its ids, token for token
    for row in rows[:10]:
        own = server.generate(row["input_ids"][:row["prompt_len"]], max_new_tokens=256, temperature=0)
        assert row["input_ids"][row["prompt_len"]:] == own["output_ids"], row["id"]
    # and the worker noted the prompts in flight at each death, and cleared them by their probes
    log = worker.log.read_text()
    assert "when it died at" in log and "its one-token probe on" in log
