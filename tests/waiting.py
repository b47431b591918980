"""Waiting on a condition, the one way the tests synchronise with real processes.

A test never sleeps to let something happen: it polls the condition it needs
(`wait_until`). A test that shows something did *not* happen first waits for a
positive sign that it had its chance (`health_rounds`: every worker ran more
rounds of its health checks, each of which re-decides whether it consumes),
then looks.
"""
from __future__ import annotations

import re
import signal
import time
from typing import Callable, Protocol

import redis

from contract.fleet import heartbeats
from producer.local import Process


class HasLogs(Protocol):
    def logs_tail(self, lines: int = 30) -> str: ...


def wait_until(predicate: Callable[[], object], timeout: float, what: str, fleet: HasLogs | None = None,
               poll: float = 0.2) -> None:
    """Poll until `predicate()` holds; fail the test, saying what it waited for (and the fleet's
    log tails, when given one), once `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:.0f}s for {what}" + (f":\n{fleet.logs_tail()}" if fleet else ""))
        time.sleep(poll)


def heartbeat_times(redis_url: str) -> dict[str, float]:
    """Each live worker's last heartbeat (written after each round of its health checks)."""
    return {record["worker"]: record["at"] for record in heartbeats.read_all(redis.Redis.from_url(redis_url))}


def health_rounds(redis_url: str, rounds: int = 3, timeout: float = 60, fleet: HasLogs | None = None,
                  workers: int | None = None) -> None:
    """Until every live worker (at least `workers` of them) has written `rounds` heartbeats
    more than it had when called: each round re-read its servers and storage and re-decided
    what it consumes, so what it did not do by then it chose not to do."""
    seen: dict[str, set[float]] = {}

    def enough() -> bool:
        for worker, at in heartbeat_times(redis_url).items():
            seen.setdefault(worker, set()).add(at)
        live = [len(ats) for ats in seen.values()]
        return len(live) >= (workers or 1) and all(n > rounds for n in live)

    wait_until(enough, timeout, f"{rounds} more health rounds of every worker", fleet)


_BROKER_LOST = re.compile(r"broker connection lost|connection to broker lost", re.IGNORECASE)


def broker_losses(workers: list[Process]) -> list[int]:
    """How many times each worker has logged losing its broker connection."""
    return [len(_BROKER_LOST.findall(worker.log.read_text(errors="replace"))) for worker in workers]


class WorkerExited(AssertionError):
    """A worker process ended while the test needed it alive."""


def stop_broker(broker: Process, workers: list[Process], fleet: HasLogs | None = None, timeout: float = 60,
                busy: float = 0.0) -> None:
    """Stop Redis and wait until every worker has noticed (rather than for a guessed while).

    With `busy` (seconds), the workers are frozen (SIGSTOP) while Redis stops and for `busy`
    seconds after, then go on (SIGCONT): as on a machine too busy to run them, each event loop's
    timers that came due meanwhile (the restore sweep, event publishes) run before it reads the
    closed broker connection, so every Redis call they make meets Redis gone. A worker that
    exited meanwhile fails the test (a worker does not die of a broker outage)."""
    before = broker_losses(workers)
    frozen = workers if busy else []
    for worker in frozen:
        worker.signal(signal.SIGSTOP)
    try:
        broker.stop()
        time.sleep(busy)  # the fault staged: how long the machine was too busy to run them
    finally:
        for worker in frozen:
            worker.signal(signal.SIGCONT)

    def all_noticed() -> bool:
        dead = [w.name for w in workers if not w.alive()]
        if dead:
            raise WorkerExited(f"worker {', '.join(dead)} exited during the broker outage:\n"
                                 + "\n".join(f"--- {w.name}\n{w.tail(40)}" for w in workers if not w.alive()))
        return all(now > then for now, then in zip(broker_losses(workers), before))

    try:
        wait_until(all_noticed, timeout, "every worker to notice the broker is gone")
    except WorkerExited:
        raise
    except AssertionError:
        late = [w for w, now, then in zip(workers, broker_losses(workers), before) if now <= then]
        raise AssertionError(
            f"{', '.join(w.name for w in late)} had not noticed the broker was gone after {timeout:.0f}s:\n"
            + "\n".join(f"--- {w.name}\n{w.tail(25)}" for w in late)
            + (f"\n{fleet.logs_tail()}" if fleet else "")) from None
