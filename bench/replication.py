"""`python -m bench.replication`: what confirming writes on a replica costs (`contract/redis_link/replication.py`).

A primary and one replica on loopback (real `redis-server` processes). Timed,
with and without `replicated` around them, alternating: one SET (the
confirmation's own cost), one enqueue batch (the
ledger's enqueue script and the publish of its messages, `BATCH` prompts) and
one group commit's ledger step (`mark_group_done` and the deliveries' clear, as
`ShardBook.mark_done` sends them, `GROUP` samples), and a group commit's two
ledger steps (its writing entries and its done marks) as `ShardBook` sends them,
each with its barrier, against the same writes unconfirmed, and one prompt's intake
(`Ledger.intake`, alone or as a worker behind a primary with replicas sends it,
`workers/intake/confirmed_intake.py`). Prints the median and p90
milliseconds per call of each, and the difference.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

from contract.broker.config import celery_app
from contract.ledger.codec import pack_ids
from contract.redis_link.connections import redis_for
from contract.ledger.ledger import Ledger
from contract.broker.publish import publish_prompts
from contract.redis_link.replication import replicated
from producer.local import free_port, redis_server_binary, spawn, wait_for
from workers.intake import confirmed_intake, deliveries
from workers.intake.reconcile import ShardBook

BATCH, GROUP, ROUNDS = 256, 64, 100


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        primary, replica = free_port(), free_port()
        processes = [spawn(f"redis-{p}", [redis_server_binary(), "--port", str(p), "--bind", "127.0.0.1",
                                          "--save", "", "--dir", tmp, "--appendonly", "no", *extra], logs)
                     for p, extra in ((primary, []), (replica, ["--replicaof", "127.0.0.1", str(primary)]))]
        try:
            url = f"redis://127.0.0.1:{primary}/0"
            client = redis_for(url)
            wait_for(lambda: client.info("replication")["connected_slaves"] == 1, 30, "the replica")
            app = celery_app(url)
            report("one write", 1, lambda n, wait: _one(client, n, wait))
            report("enqueue batch", BATCH, lambda n, wait: _enqueue(client, app, n, wait))
            report("group commit", GROUP, lambda n, wait: _commit(client, n, wait))
            report("group commit, both ledger steps", GROUP, lambda n, wait: _book(client, n, wait))
            report("intake", 1, _intakes(client))
        finally:
            for process in processes:
                process.stop(timeout=10)


def report(what: str, size: int, call) -> None:
    timings: dict[bool, list[float]] = {False: [], True: []}
    for n in range(ROUNDS):
        for wait in (n % 2 == 0, n % 2 == 1):  # alternate which goes first
            started = time.perf_counter()
            call(n, wait)
            timings[wait].append((time.perf_counter() - started) * 1000)
    plain, confirmed = (statistics.median(timings[w]) for w in (False, True))
    p90 = {w: statistics.quantiles(timings[w], n=10)[-1] for w in timings}
    print(f"{what} ({size}): {plain:.2f} ms without, {confirmed:.2f} ms with WAIT (median; p90 "
          f"{p90[False]:.2f} / {p90[True]:.2f}): +{confirmed - plain:.2f} ms per call, "
          f"+{(confirmed - plain) * 1000 / size:.1f} us per prompt")


def _maybe(client, wait: bool):
    return replicated(client) if wait else nullcontext()


def _one(client, n: int, wait: bool) -> None:
    with _maybe(client, wait):
        client.set("bench-replication:one", n)


def _enqueue(client, app, n: int, wait: bool) -> None:
    ledger = Ledger(client, "bench-replication")
    items = [(f"e{n}-{wait}-{i}", pack_ids(list(range(200)))) for i in range(BATCH)]
    with _maybe(client, wait):
        ledger.enqueue(items, call=str(n))
        publish_prompts(app, ledger.run, "bench-replication", [(pid, 200, None) for pid, _ in items])


def _commit(client, n: int, wait: bool) -> None:
    ledger = Ledger(client, "bench-replication")
    ids = [f"c{n}-{wait}-{i}" for i in range(GROUP)]
    ledger.enqueue([(pid, pack_ids([1, 2, 3])) for pid in ids])
    with _maybe(client, wait), client.pipeline(transaction=False) as pipe:
        ledger.mark_group_done([(pid, 100) for pid in ids], f"/tmp/shard-{n}.parquet", pipe)
        deliveries.clear(pipe, ledger.run, *ids)
        pipe.execute()


def _book(client, n: int, wait: bool) -> None:
    """A group commit's two ledger steps, the writing entries before the shard and the done marks
    after it: as `ShardBook` sends them (each with its barrier and WAIT in its pipeline), or
    without any confirmation."""
    ledger = Ledger(client, "bench-replication")
    ids = [f"b{n}-{wait}-{i}" for i in range(GROUP)]
    ledger.enqueue([(pid, pack_ids([1, 2, 3])) for pid in ids])
    shard = f"/tmp/shard-b{n}.parquet"
    if wait:
        book = ShardBook(client)
        book.writing(ledger.run, [SimpleNamespace(id=pid) for pid in ids], shard)
        book.mark(ledger.run, [(pid, 100) for pid in ids], shard)
        return
    ledger.writing(ids, shard)
    with client.pipeline(transaction=False) as pipe:
        ledger.mark_group_done([(pid, 100) for pid in ids], shard, pipe)
        deliveries.clear(pipe, ledger.run, *ids)
        pipe.execute()


def _intakes(client):
    """One prompt's intake a call, each of a prompt of its own (queued beforehand, untimed)."""
    ledger = Ledger(client, "bench-replication")
    ledger.enqueue([(f"i{n}-{wait}", pack_ids(list(range(200)))) for n in range(ROUNDS) for wait in (False, True)])

    def intake(n: int, wait: bool) -> None:
        if wait:
            confirmed_intake.take(client, ledger.run, f"i{n}-{wait}", "bench-worker", 5)
        else:
            ledger.intake(f"i{n}-{wait}", "bench-worker", 5)
    return intake


if __name__ == "__main__":
    main()
