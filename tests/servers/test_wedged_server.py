"""A wedged server: its engine hangs while its HTTP front still answers.

Real redis-server, stand-ins and `celery -A workers worker` processes. The
stand-in's wedge (`POST /standin/wedge`, or `--wedge` at start) keeps the port
open, answers `/health` with 200's head and then a byte every half second,
and holds `/generate` and the scheduler's routes for as long as it lasts, so
neither a per-read timeout nor `FLEET_REQUEST_TIMEOUT` (left at its default
of an hour) ever ends a request there. The worker must mark it down within
`FLEET_HEALTH_INTERVAL x FLEET_HEALTH_FAILURES + FLEET_HEALTH_TIMEOUT` (plus
scheduling slack on a shared machine), cut what it has in flight there, and
have the other server store those prompts, as first attempts.
"""
from __future__ import annotations

import httpx

from sglang_standin.cli import parse_config
from sglang_standin.outputs import generate_output

from conftest import messages_of, render, varied_prompts, write_prompts
from waiting import wait_until

MAX_NEW_TOKENS = 300
SLOW = ["--step-base", "0.02", "--output-len-max", "100", "--wedge-trickle-seconds", "0.5"]  # ~2 s a generation
INTERVAL, FAILURES, TIMEOUT = 2.0, 2, 2.0  # the bound holds for a timeout no longer than the interval
HEALTH = {"FLEET_HEALTH_INTERVAL": str(INTERVAL), "FLEET_HEALTH_FAILURES": str(FAILURES),
          "FLEET_HEALTH_TIMEOUT": str(TIMEOUT), "FLEET_MAX_INFLIGHT_PER_SERVER": "4", "FLEET_CONCURRENCY": "12"}
MARKED_DOWN_WITHIN = INTERVAL * FAILURES + TIMEOUT + 5.0  # + slack for a busy two-core machine


def expected(records, tokenizer) -> dict[str, list[int]]:
    """Each prompt's exact ids, prompt and output, as any of the (identically configured) stand-ins makes them."""
    cfg = parse_config(["--port", "1", *SLOW])
    plan = {}
    for record in records:
        ids = render(tokenizer, messages_of(record))
        plan[record["id"]] = ids + generate_output(ids, MAX_NEW_TOKENS, cfg)[0]
    return plan


def enqueue(fleet, path, records) -> None:
    fleet.producer("enqueue", str(write_prompts(path, records)), "--max-new-tokens", str(MAX_NEW_TOKENS))


def stats(url: str) -> dict:
    return httpx.get(f"{url}/standin/stats").json()


def wedge(url: str, on: bool) -> None:
    assert httpx.post(f"{url}/standin/wedge", json={"wedged": on}).json() == {"wedged": on}


def marked_down(worker, url: str) -> bool:
    return f"server {url}: healthy -> down" in worker.log.read_text()


def assert_stored_exactly(fleet, plan: dict[str, list[int]]) -> dict[str, dict]:
    rows = {}
    for row in fleet.rows():
        assert row["id"] not in rows, f"{row['id']} stored twice"
        rows[row["id"]] = row
    assert set(rows) == set(plan)
    assert all(rows[pid]["input_ids"] == ids for pid, ids in plan.items())
    assert fleet.dead_letters() == []
    return rows


def test_a_wedged_server_is_marked_down_in_time_and_its_prompts_are_stored_by_the_other(fleet, tokenizer, tmp_path):
    # Given two servers, a worker bound to both with its request timeout at the default hour, and 40 prompts
    _, a = fleet.standin(*SLOW)
    _, b = fleet.standin(*SLOW)
    worker = fleet.worker("w1", [a, b], **HEALTH)
    records = varied_prompts(40)
    plan = expected(records, tokenizer)
    enqueue(fleet, tmp_path / "p.jsonl", records)
    wait_until(lambda: stats(a)["running"] >= 2 and fleet.states().get("done", 0) >= 2, 120,
               "requests in flight on the first server", fleet)

    # When the first server's engine hangs mid-run
    wedge(a, True)

    # Then the worker marks it down within the health settings' bound and cuts its requests there
    wait_until(lambda: marked_down(worker, a), MARKED_DOWN_WITHIN, "the wedged server marked down", fleet)
    wait_until(lambda: "requests in flight there cut" in worker.log.read_text(), 10, "the cut", fleet)

    # and every prompt is stored token-exact, none dead, long before the hour a request may take
    assert fleet.wait_finished(timeout=180) == {"done": 40}
    rows = assert_stored_exactly(fleet, plan)
    held = set(stats(a)["wedged"])
    assert held, "the wedged server held no request"
    for pid in held:  # what it held went to the other server, as a first attempt, not a retry
        assert rows[pid]["server"] == b and rows[pid]["attempts"] == 1, rows[pid]


def test_a_server_wedged_at_start_never_gets_a_prompt(fleet, tokenizer, tmp_path):
    # Given a server wedged from the start (its /health never ends) and a healthy one
    _, a = fleet.standin(*SLOW, "--wedge", wait_healthy=False)
    _, b = fleet.standin(*SLOW)
    wait_until(lambda: httpx.get(f"{a}/standin/stats").status_code == 200, 60, "the wedged server listening")
    worker = fleet.worker("w1", [a, b], **HEALTH)
    records = varied_prompts(12)
    plan = expected(records, tokenizer)

    # When prompts are enqueued
    enqueue(fleet, tmp_path / "p.jsonl", records)

    # Then the healthy server stores them all, and the wedged one is judged down and sent nothing
    assert fleet.wait_finished(timeout=180) == {"done": 12}
    rows = assert_stored_exactly(fleet, plan)
    assert {row["server"] for row in rows.values()} == {b}
    assert stats(a)["requests"] == 0
    assert f"server {a}: unknown -> down (/health did not answer in full within 2s)" in worker.log.read_text()


def preflights_passed(worker, url: str) -> int:
    """Times the worker judged the server ready (its preflight passed): from then on it sends it prompts."""
    return worker.log.read_text().count(f"server {url} ready:")


def test_a_wedge_that_heals_gives_the_server_back_its_prompts(fleet, tokenizer, tmp_path):
    # Given two servers, a worker bound to both, and a first batch in flight on both
    _, a = fleet.standin(*SLOW)
    _, b = fleet.standin(*SLOW)
    worker = fleet.worker("w1", [a, b], **HEALTH)
    # The second batch's prompts differ from the first's: a prompt the worker has sent before prefers the
    # server it went to (affinity), and when the wedge cuts all that the first server held, that is the other
    # server for every prompt of the first batch, and a second batch of the same prompts waits for it
    first, second = varied_prompts(20, "first"), varied_prompts(40, "second")[20:]
    plan = expected(first + second, tokenizer)
    enqueue(fleet, tmp_path / "first.jsonl", first)
    wait_until(lambda: stats(a)["running"] >= 1, 120, "requests in flight on the first server", fleet)

    # When its engine hangs until the worker marks it down, and then recovers, and the worker has judged it
    # ready again (its preflight passed: `down -> healthy` is logged before it) before a second batch comes
    wedge(a, True)
    wait_until(lambda: marked_down(worker, a), MARKED_DOWN_WITHIN, "the wedged server marked down", fleet)
    wedge(a, False)
    wait_until(lambda: f"server {a}: down -> healthy" in worker.log.read_text(), 30, "the server back", fleet)
    wait_until(lambda: preflights_passed(worker, a) == 2, 30, "the server judged ready again", fleet)
    served_before = len(stats(a)["generations"])
    enqueue(fleet, tmp_path / "second.jsonl", second)

    # Then it takes prompts again (the other server holds at most 4 of the 20 at a time), and every prompt
    # of both batches is stored once, token-exact, none dead
    assert fleet.wait_finished(timeout=180) == {"done": 40}
    rows = assert_stored_exactly(fleet, plan)
    assert any(row["server"] == a and row["id"].startswith("second") for row in rows.values())
    assert len(stats(a)["generations"]) > served_before
