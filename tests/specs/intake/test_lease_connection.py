"""The lease keeper renews on a connection of its own (workers/intake/redis_pool.py): task threads that
hold every shared connection (settling a failover, `replication.confirm`) never hold up a lease round."""
from __future__ import annotations

import threading

from contract.broker.worker_lease import HOLDER
from contract.keys import LEASES
from workers.intake.lease import keeper_leases
from workers.intake.redis_pool import worker_redis
from workers.settings import Settings


def test_a_lease_round_goes_through_while_task_threads_hold_every_shared_connection(server, client):
    # Given a worker whose task threads hold every connection of its shared pool
    shared = worker_redis(server).connection_pool
    held = [shared.get_connection() for _ in range(shared.max_connections)]
    try:
        # When its lease keeper runs a round (in a thread, so a round stuck behind them fails the test
        # instead of hanging it)
        leases = keeper_leases(Settings(redis_url=server))
        done = threading.Event()
        threading.Thread(target=lambda: (leases.round({}), done.set()), daemon=True).start()

        # Then the round completes on the keeper's own connection, and the worker's lease is renewed
        assert done.wait(20), "the lease round waited for a shared connection"
        assert client.zscore(LEASES, HOLDER.name) is not None
    finally:
        for connection in held:
            shared.release(connection)
