"""A worker's heartbeat and its sharer stamps: one round trip a health round.

After each round of health checks a worker writes its heartbeat
(`contract/fleet/heartbeats.py`) and stamps itself as a sharer of its usable
servers (`workers/servers/sharers.py`). Redis's cost is round trips, nearly
whatever they carry (~60 us of Redis CPU each on the bench's VM), so both go in
one pipeline. The heartbeat is built before the pipeline is sent, so the
servers it lists carry the share count (`sharers`) and the starting target it
set (`target`) as of the round before; the counts this round's stamps read
are applied to the pool only once the replies are back, and show in the next
heartbeat. What `python -m producer status` shows of a server's sharers is
thus one health round (`FLEET_HEALTH_INTERVAL`) older than before; the tuner
itself sees each count as soon as it was read, as before.
"""
from __future__ import annotations

import redis

from contract.fleet import heartbeats
from contract.redis_link.clock import CLOCK

from ..servers import sharers
from ..servers.bindings import ServerPool


def beat(client: redis.Redis, worker: str, pool: ServerPool, ttl: float, **heartbeat) -> None:
    """Stamp `worker` on its usable servers and publish its heartbeat (`heartbeat`: the rest of
    `heartbeats.publish`'s state) in one pipeline; then the pool learns its servers' sharers."""
    with client.pipeline(transaction=False) as pipe:
        counts = sharers.stamp(pipe, worker, [b.url for b in pool.bindings if b.usable], ttl, CLOCK.now(client))
        heartbeats.publish(client, worker, pool.snapshot(), ttl=ttl, pipe=pipe, **heartbeat)
        replies = pipe.execute()
    pool.shared_by(counts(replies))
