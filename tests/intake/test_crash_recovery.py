"""Nothing lost, nothing run twice: worker crashes, leases, shutdown and broker restarts."""
from __future__ import annotations

import signal
import time

import httpx
import redis

from contract.fleet import heartbeats
from producer.local import free_port, start_redis

from conftest import varied_prompts, write_prompts
from metric_pages import sum_of, worker_page
from waiting import stop_broker, wait_until

LEASE = {"FLEET_LEASE_SECONDS": "8", "FLEET_RESTORE_INTERVAL": "1"}


def _done(fleet) -> int:
    return fleet.states().get("done", 0)


def _two_workers_in_flight(fleet, tmp_path, struck: str, other: str):
    """Given two workers sharing slow servers, each holding at most 32 prompts, with a short lease,
    and 120 prompts, some of which the worker named `struck` holds; that worker."""
    _, url = fleet.standin("--step-base", "0.02", "--max-running-requests", "256")
    most = {"FLEET_CONCURRENCY": "32", "FLEET_MAX_INFLIGHT_PER_SERVER": "32"}  # neither takes the whole run
    victim = fleet.worker(struck, [url], **LEASE, **most)
    fleet.worker(other, [url], **LEASE, **most)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(120))))
    wait_until(lambda: _held_by(fleet, struck), 60, f"{struck} to hold prompts", fleet)
    return victim


def _held_by(fleet, worker: str) -> list[str]:
    """The prompts `worker`'s last heartbeat lists as held."""
    for record in heartbeats.read_all(redis.Redis.from_url(fleet.redis_url)):
        if record["worker"].startswith(f"{worker}@"):
            return [pid for pids in (record.get("holding") or {}).values() for pid in pids]
    return []


def _every_prompt_done_once(fleet) -> None:
    assert fleet.wait_finished(timeout=180) == {"done": 120}
    assert fleet.dead_letters() == []
    assert fleet.counters()["state:done"] == 120
    assert {r["id"] for r in fleet.rows()} == {f"p-{i:04d}" for i in range(120)}


def test_a_killed_workers_prompts_are_taken_up_by_another_within_the_lease(fleet, tmp_path):
    victim = _two_workers_in_flight(fleet, tmp_path, "victim", "survivor")

    # When one worker is SIGKILLed with prompts in flight
    victim.signal(signal.SIGKILL)

    # Then the other finishes everything (the victim's prompts once their lease ran out):
    # nothing lost, nothing dead-lettered
    _every_prompt_done_once(fleet)


def test_a_worker_frozen_past_its_lease_goes_on_and_every_prompt_ends_done_once(fleet, tmp_path):
    frozen = _two_workers_in_flight(fleet, tmp_path, "frozen", "other")

    # When one worker freezes (SIGSTOP: its connections open, its generations still running on the
    # server) for twice the lease, so the other takes its prompts up, then thaws with its answers
    # to store
    frozen.signal(signal.SIGSTOP)
    try:
        time.sleep(16)  # the fault's length (the lease is 8 s), not a synchronisation
    finally:
        frozen.signal(signal.SIGCONT)

    # Then every prompt ends done, counted once, none dead-lettered, and the thawed worker lives on
    _every_prompt_done_once(fleet)
    assert frozen.alive()


def test_a_prompt_taken_from_a_frozen_worker_waits_for_its_generation_still_running_there_and_is_stored(
        fleet, tmp_path):
    # Given a prompt whose generation takes 20 s, taken by w1, and a short lease
    _, url = fleet.standin("--fault-slow", "1", "--slow-seconds", "20")
    spend = {"FLEET_MAX_ATTEMPTS": "2", **LEASE}  # two failures would dead-letter it
    frozen = fleet.worker("w1", [url], **spend)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(1))))
    wait_until(lambda: httpx.get(f"{url}/standin/stats").json()["generating"], 60, "w1 generating", fleet)

    # When w1 freezes (its request still running on the server) and w2 takes the prompt once w1's lease
    # has run out, while the server still generates w1's request (SGLang refuses the same rid meanwhile)
    frozen.signal(signal.SIGSTOP)
    try:
        metrics = free_port()
        fleet.worker("w2", [url], FLEET_METRICS_PORT=str(metrics), **spend)

        # Then w2 waits for it to end, spending no attempt, and stores the prompt: nothing dead-lettered
        assert fleet.wait_finished(timeout=120) == {"done": 1}
        assert fleet.dead_letters() == []
        assert [r["id"] for r in fleet.rows()] == ["p-0000"]
        # (and it did meet w1's request there: its waits counted as retries of their own kind)
        assert _waits_for_the_server(metrics)
    finally:
        frozen.signal(signal.SIGCONT)


def test_a_prompt_taken_from_two_frozen_workers_in_turn_is_stored_once_and_never_dead_lettered(fleet, tmp_path):
    # Given a prompt whose generations take 35 s each, taken by w1, and a short lease
    _, url = fleet.standin("--fault-slow", "1", "--slow-seconds", "35")
    spend = {"FLEET_MAX_ATTEMPTS": "2", **LEASE}  # two failures would dead-letter it
    first = fleet.worker("w1", [url], **spend)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(1))))
    wait_until(lambda: httpx.get(f"{url}/standin/stats").json()["generating"], 60, "w1 generating", fleet)
    frozen = [first]
    try:
        # When w1 freezes, w2 takes the prompt once w1's lease has run out and waits for w1's request
        # still running on the server, and then w2 freezes too, mid-wait
        first.signal(signal.SIGSTOP)
        metrics = free_port()
        second = fleet.worker("w2", [url], FLEET_METRICS_PORT=str(metrics), **spend)
        wait_until(lambda: _waits_for_the_server(metrics), 60, "w2 waiting for w1's request", fleet)
        second.signal(signal.SIGSTOP)
        frozen.append(second)
        # and w3 takes it once w2's lease has run out in turn
        third = free_port()
        fleet.worker("w3", [url], FLEET_METRICS_PORT=str(third), **spend)

        # Then w3, having waited for w1's request in turn, stores it once that has ended: nothing
        # dead-lettered, no attempt spent on waiting
        assert fleet.wait_finished(timeout=180) == {"done": 1}
        assert fleet.dead_letters() == []
        assert _waits_for_the_server(third)
    finally:
        for worker in frozen:
            worker.signal(signal.SIGCONT)
    # and once both thaw (w1 with its answer), the prompt is still done once, counted once, and w2,
    # thawed mid-wait, does not send it again: the server generated it twice, for w1 and for w3
    wait_until(lambda: all(w.alive() for w in frozen) and _settled(fleet, ["w1", "w2"]), 120,
               "the thawed workers settled", fleet)
    assert fleet.states() == {"done": 1} and fleet.counters()["state:done"] == 1
    assert {r["id"] for r in fleet.rows()} == {"p-0000"}
    assert httpx.get(f"{url}/standin/stats").json()["generations"]["p-0000"] == 2


def _waits_for_the_server(metrics_port: int) -> bool:
    """Whether the worker serving metrics there has met a request of the same rid still running."""
    try:
        return sum_of(worker_page(metrics_port), "fleet_retries_total", kind="in_flight") >= 1
    except httpx.HTTPError:
        return False


def _settled(fleet, names: list[str]) -> bool:
    """Each of these workers beats again, listing no prompt as held."""
    records = {r["worker"].split("@")[0]: r for r in heartbeats.read_all(redis.Redis.from_url(fleet.redis_url))}
    return all(name in records and not any((records[name].get("holding") or {}).values()) for name in names)


def test_a_generation_longer_than_the_lease_is_never_handed_to_a_second_worker(fleet, tmp_path):
    # Given generations that outlast the lease several times over, and two workers
    _, url = fleet.standin("--fault-slow", "0.25", "--slow-seconds", "20")
    fleet.worker("w1", [url], **LEASE)
    fleet.worker("w2", [url], **LEASE)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(40))))

    # When they all finish
    assert fleet.wait_finished(timeout=180) == {"done": 40}

    # Then each prompt was generated exactly once, slow ones included
    stats = httpx.get(f"{url}/standin/stats").json()
    assert len(stats["generations"]) == 40 and set(stats["generations"].values()) == {1}
    assert len(fleet.rows()) == 40


def test_sigterm_drains_in_flight_prompts_and_exits_zero(fleet, tmp_path):
    # Given a worker with prompts in flight, some of them generations far longer than its grace period
    _, url = fleet.standin("--step-base", "0.01", "--fault-slow", "0.2", "--slow-seconds", "30")
    worker = fleet.worker("w1", [url], FLEET_SHUTDOWN_GRACE="6", **LEASE)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(100))))
    wait_until(lambda: _done(fleet) >= 5, 60, "first samples", fleet)

    # When it gets SIGTERM, as Kubernetes sends it
    worker.signal(signal.SIGTERM)

    # Then it exits 0 after the grace period (not after its 30 s generations), with every
    # sample it finished in a shard
    assert worker.popen.wait(30) == 0
    stored = {r["id"] for r in fleet.rows()}
    assert _done(fleet) == len(stored) < 100
    log = worker.log.read_text()
    assert "handing" in log and "back to the queue" in log

    # and a new worker finishes the rest, handed-back prompts included, without losing any
    fleet.worker("w2", [url], **LEASE)
    assert fleet.wait_finished(timeout=300) == {"done": 100}
    ids = [r["id"] for r in fleet.rows()]
    assert sorted(set(ids)) == sorted(f"p-{i:04d}" for i in range(100))


def test_a_redis_restart_mid_run_loses_nothing(fleet, tmp_path):
    # Given Redis with append-only persistence, a worker and a run in progress
    _, url = fleet.standin("--step-base", "0.01")
    data = tmp_path / "redis-data"
    broker, fleet.redis_url = start_redis(fleet.logs, port=None, data_dir=data, appendonly=True)
    fleet.processes.append(broker)
    worker = fleet.worker("w1", [url], **LEASE)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(150))))
    wait_until(lambda: _done(fleet) >= 20, 60, "first samples", fleet)

    # When Redis stops and, once the worker has noticed, restarts on the same port and data
    broker_port = int(fleet.redis_url.rsplit(":", 1)[1].split("/")[0])
    stop_broker(broker, [worker], fleet)
    broker, _ = start_redis(fleet.logs, port=broker_port, data_dir=data, appendonly=True)
    fleet.processes.append(broker)

    # Then the worker reconnects and every prompt is stored
    assert fleet.wait_finished(timeout=240) == {"done": 150}
    assert {r["id"] for r in fleet.rows()} == {f"p-{i:04d}" for i in range(150)}
