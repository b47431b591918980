"""A worker that dies holding prompts (an eviction, the OOM killer) hands them back within its lease.

Real redis-server, stand-ins and `celery -A workers worker` processes, with
the lease of the field report (issue 43): `FLEET_LEASE_SECONDS=6`,
`FLEET_RESTORE_INTERVAL=2`, heartbeats that live 8 s (`FLEET_HEALTH_INTERVAL`
1, health timeout 5), so a dead worker's lease runs out while its last
heartbeat, which lists the prompts it held, is still there.

The doomed workers are bound to a stand-in on which every request hangs (a
generation that never returns, as on a server that will never answer the
worker killed while waiting); the worker that takes over is bound to a good
one. So a prompt is stored only by the worker meant to take it over, and each
prompt's count of generations there says whether it was started twice.

What a user checks: every prompt stored exactly once, none dead-lettered (or,
for a prompt that kills every worker holding it, a `poison` letter naming
them), each generated once by the survivor, within a bound of a lease, and
the lost-message audit never needed (its "republished" line absent).
"""
from __future__ import annotations

import signal
import time
from collections import Counter

import httpx
import redis

from contract.ledger import deliveries
from contract.keys import RunKeys

from conftest import varied_prompts, write_prompts
from waiting import wait_until

LEASE_S = 6.0
ENV = {"FLEET_LEASE_SECONDS": str(int(LEASE_S)), "FLEET_RESTORE_INTERVAL": "2",
       "FLEET_CONCURRENCY": "4", "FLEET_MAX_INFLIGHT_PER_SERVER": "4"}
HANG = ("--fault-slow", "1", "--slow-seconds", "3600")  # every request hangs for an hour
# A dead worker's prompts are back on their queue 0.75 to 1.25 leases after its last lease round
# (a live worker's next round, then the sweep): taken over within 1.25 leases, a restore interval
# and a heartbeat's life (8 s: the survivor makes sure the dead worker is not generating them),
# plus the generation and the group commit, plus slack for a loaded two-core machine.
WITHIN = 1.25 * LEASE_S + 2 + 8 + 10
AUDITED = "audit: republished"


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()


def _stored(fleet) -> Counter:
    return Counter(r["id"] for r in fleet.rows())


def _workers_up(fleet, names: list[str]) -> None:
    """Until each named worker has written a heartbeat (it consumes from then on)."""
    from contract.fleet import heartbeats
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: {n for n in names} <= {r["worker"].split("@")[0] for r in heartbeats.read_all(client)},
               120, f"workers {names} up", fleet)


def _doomed_hold(fleet, tmp_path, names: list[str], n: int, each: int = 2) -> tuple[str, str, list]:
    """Given `n` prompts, the workers `names` bound to a stand-in where every request hangs, each
    with `each` requests in flight there at least, and a good stand-in for a survivor:
    (the hanging stand-in's URL, the good one's, the doomed workers)."""
    _, hanging = fleet.standin(*HANG)
    _, good = fleet.standin("--step-base", "0.01")
    doomed = []
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))))
    for name in names:
        before = len(_stats(hanging)["generating"])
        doomed.append(fleet.worker(name, [hanging], **ENV))
        wait_until(lambda: len(_stats(hanging)["generating"]) >= before + each, 120, f"{name} generating", fleet)
    return hanging, good, doomed


def _taken_over_within_a_lease(fleet, survivor, good: str, n: int, since: float) -> float:
    """Then every prompt is stored exactly once, by the survivor, generated once there, none
    dead-lettered, within the bound, and the audit never republished one; the seconds it took."""
    ids = {f"p-{i:04d}" for i in range(n)}
    wait_until(lambda: set(_stored(fleet)) == ids, WITHIN + 60, "every prompt stored", fleet, poll=0.25)
    took = time.monotonic() - since
    assert fleet.wait_finished(timeout=30) == {"done": n}
    assert _stored(fleet) == {pid: 1 for pid in ids}
    assert _stats(good)["generations"] == {pid: 1 for pid in ids}
    assert fleet.dead_letters() == []
    assert AUDITED not in survivor.log.read_text()
    assert took < WITHIN, f"the dead workers' prompts took {took:.1f}s to be stored (bound {WITHIN:.0f}s)"
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: client.hlen(RunKeys("default").deliveries) == 0, 30, "no delivery left noted", fleet)
    print(f"\nFIGURE taken over and stored {took:.1f}s after the fault (bound {WITHIN:.0f}s)")
    return took


def _kill(process) -> None:
    process.signal(signal.SIGKILL)
    process.popen.wait(10)


def test_a_killed_workers_prompts_hanging_requests_among_them_are_stored_elsewhere_within_a_lease(
        fleet, tmp_path):
    _, good, (doomed,) = _doomed_hold(fleet, tmp_path, ["doomed"], 8)
    survivor = fleet.worker("survivor", [good], **ENV)
    _workers_up(fleet, ["doomed", "survivor"])

    # When the worker is SIGKILLed (the OOM killer) while its requests hang
    _kill(doomed)
    killed = time.monotonic()

    # Then its prompts are generated and stored by the other within the bound, never by the audit
    _taken_over_within_a_lease(fleet, survivor, good, 8, killed)


def test_a_frozen_workers_prompts_are_stored_elsewhere_within_a_lease_and_it_lives_on(fleet, tmp_path):
    _, good, (frozen,) = _doomed_hold(fleet, tmp_path, ["frozen"], 8)
    survivor = fleet.worker("survivor", [good], **ENV)
    _workers_up(fleet, ["frozen", "survivor"])

    # When the worker freezes (SIGSTOP: its connections open, its requests still waiting) and stays
    # frozen until the other has stored everything
    frozen.signal(signal.SIGSTOP)
    try:
        _taken_over_within_a_lease(fleet, survivor, good, 8, time.monotonic())
    finally:
        frozen.signal(signal.SIGCONT)

    # Then, thawed, it lives on, and nothing it held is stored again
    time.sleep(2 * LEASE_S)  # the thawed worker's lease rounds and health rounds run meanwhile
    assert frozen.alive()
    assert set(_stored(fleet).values()) == {1}


def test_a_prompt_killed_twice_in_a_row_is_stored_once_within_a_lease_of_each_death(fleet, tmp_path):
    hanging, good, (first,) = _doomed_hold(fleet, tmp_path, ["first"], 4, each=4)

    # When its worker is SIGKILLed, a second worker (on the same hanging server) takes its prompts
    # over, and is SIGKILLed in turn
    _kill(first)
    killed = time.monotonic()
    second = fleet.worker("second", [hanging], **ENV)
    wait_until(lambda: set(_stats(hanging)["generations"].values()) == {2}, WITHIN + 30,
               "second generating them all", fleet)
    assert time.monotonic() - killed < WITHIN + 10  # start-up of the second included
    _kill(second)
    killed = time.monotonic()
    survivor = fleet.worker("survivor", [good], **ENV)

    # Then the third stores each once, within the bound of the second death, never through the audit
    _taken_over_within_a_lease(fleet, survivor, good, 4, killed)


def test_two_workers_killed_at_once_hand_every_prompt_back_within_a_lease(fleet, tmp_path):
    _, good, doomed = _doomed_hold(fleet, tmp_path, ["one", "two"], 10)
    survivor = fleet.worker("survivor", [good], **ENV)
    _workers_up(fleet, ["one", "two", "survivor"])

    # When both are SIGKILLed at the same moment
    for process in doomed:
        process.signal(signal.SIGKILL)
    for process in doomed:
        process.popen.wait(10)
    killed = time.monotonic()

    # Then the survivor stores every prompt once, within the bound
    _taken_over_within_a_lease(fleet, survivor, good, 10, killed)


def test_a_worker_killed_before_its_group_commit_has_its_samples_generated_again_within_a_lease(
        fleet, tmp_path):
    # Given a worker whose group commit waits far longer than the test (a group is due at 600 s or
    # 16 samples: half its threads), and 8 prompts it has generated
    _, first = fleet.standin("--step-base", "0.01")
    _, good = fleet.standin("--step-base", "0.01")
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(8))))
    doomed = fleet.worker("doomed", [first], FLEET_SHARD_MAX_WAIT="600", FLEET_SHARD_MAX_ROWS="1000",
                          **{**ENV, "FLEET_CONCURRENCY": "32", "FLEET_MAX_INFLIGHT_PER_SERVER": "16"})
    wait_until(lambda: len(_stats(first)["generations"]) == 8 and not _stats(first)["generating"], 120,
               "every prompt generated, waiting for its group commit", fleet)
    survivor = fleet.worker("survivor", [good], **ENV)
    _workers_up(fleet, ["doomed", "survivor"])
    assert fleet.rows() == []

    # When it is SIGKILLed with every sample waiting for its shard
    _kill(doomed)

    # Then the other generates and stores each once, within the bound, never through the audit
    _taken_over_within_a_lease(fleet, survivor, good, 8, time.monotonic())


def test_a_prompt_that_kills_every_worker_holding_it_is_a_poison_dead_letter_without_the_audit(
        fleet, tokenizer, tmp_path):
    # Given one prompt whose generation never ends, workers that allow one unfinished delivery of a
    # prompt (then one more, alone in its worker: its last chance), and one worker at a time
    _, hanging = fleet.standin(*HANG)
    client = redis.Redis.from_url(fleet.redis_url)
    env = {**ENV, "FLEET_MAX_DELIVERIES": "1"}
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(1))))
    names = ["w1", "w2", "w3"]
    workers = []

    # When each worker that runs it is SIGKILLed (the OOM killer) and replaced at once
    for started, name in enumerate(names[:2], start=1):
        workers.append(fleet.worker(name, [hanging], **env))
        wait_until(lambda: any(h.startswith(f"{name}@")
                               for h in deliveries.names(client.hget(RunKeys("default").deliveries, "p-0000")))
                   and _stats(hanging)["generations"].get("p-0000", 0) >= started, WITHIN + 30, f"{name} runs it",
                   fleet)
        _kill(workers[-1])
        killed = time.monotonic()
    last = fleet.worker(names[2], [hanging], **env)

    # Then the next delivery is a poison dead letter naming both, within the bound of the last
    # death, generated twice and never a third time, never through the audit
    wait_until(lambda: fleet.states() == {"dead": 1}, WITHIN + 60, "the poison dead letter", fleet)
    took = time.monotonic() - killed
    (letter,) = fleet.dead_letters()
    assert letter["reason"] == "poison"
    assert [w.split("@")[0] for w in letter["excerpt"]["held_by"]] == ["w1", "w2"]
    assert _stats(hanging)["generations"] == {"p-0000": 2}
    assert AUDITED not in last.log.read_text()
    assert took < WITHIN + 10, took  # the last worker's start-up included
