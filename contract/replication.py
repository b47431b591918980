"""Writes confirmed on a replica before they are reported: what a failover may not lose.

Redis replicates asynchronously, so a replica promoted by Sentinel can lack the
last writes its old primary acknowledged. `WAIT 1 <ms>` blocks until a replica
has the writes of the connection that sends it, and the fleet writes on many
connections (the ledger's pool, kombu's publishing channel), so `replicated`
confirms them all at once with a barrier: one INCR of `REPLICATED`, sent
after the caller's writes were answered, and `WAIT` on the same connection
(one pipeline). The replication stream is ordered, so a replica that has the
barrier has every write the primary answered before it.

It also catches the failover itself: the primary's replication id
(`master_replid`) changes when a replica is promoted, so one read before the
writes and one after the barrier, on the primary of the moment, tell whether
the writes and the confirmation met the same primary; if not, `FailedOver`,
and the caller reports nothing as done (the writes may be gone).

A primary without replicas has nothing to wait for (a `WAIT 1` there would
only time out), so a plain single Redis pays one `INFO replication` per
call. A replica that lags holds the call (and the caller waits: back-pressure,
not loss) until it catches up; a primary left without replicas is trusted
alone only after `ALONE_AFTER` seconds, longer than Sentinel takes to demote
an old primary that comes back (whose writes of that moment it discards). WAIT narrows the loss window to nothing that was reported;
it does not make Redis a consensus store (a replica that has the write can
still lose the election), which is why every transition is also repaired
after the fact (the audit, reconcile).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator, NamedTuple

import redis

from .keys import REPLICATED

log = logging.getLogger(__name__)
WAIT_MS = 1000  # one WAIT's bound; the call sends another while unconfirmed
ALONE_AFTER = 15.0  # seconds without replicas after which a primary that had some is trusted alone


class FailedOver(redis.ConnectionError):
    """The primary changed between the writes and their confirmation: they may be lost."""


class Primary(NamedTuple):
    replid: str
    replicas: int


def primary(client: redis.Redis) -> Primary:
    """Who the primary is (its replication id) and how many replicas it has now. A Redis that
    refuses INFO (an ACL without it) is taken as one without replicas, and said so once."""
    try:
        info = client.info("replication")
    except redis.ResponseError as exc:
        if not _refused:
            _refused.append(exc)
            log.warning("Redis refuses INFO (%s): writes are not confirmed on a replica", exc)
        return Primary("", 0)
    return Primary(str(info.get("master_replid", "")), int(info.get("connected_slaves", 0)))


_refused: list[Exception] = []


@contextmanager
def replicated(client: redis.Redis, wait_ms: int = WAIT_MS) -> Iterator[None]:
    """Around writes that must survive a failover once they are reported: returns only when
    a replica has them (or the primary has none), raises `FailedOver` when a failover may
    have lost them."""
    before = primary(client)
    yield
    if before.replicas:
        confirm(client, before, wait_ms)


def confirm(client: redis.Redis, before: Primary, wait_ms: int = WAIT_MS, alone_after: float = ALONE_AFTER) -> None:
    """The barrier and its WAIT, again until a replica has it. A primary that had replicas and
    now has none may be one Sentinel is demoting (frozen, then resumed: its writes will be
    discarded), so it is trusted alone only after `alone_after` seconds without any."""
    started = time.monotonic()
    warned = False
    while True:
        with client.pipeline(transaction=False) as pipe:
            pipe.incr(REPLICATED)
            pipe.execute_command("WAIT", 1, wait_ms)
            pipe.info("replication")
            _, acked, info = pipe.execute()
        if str(info.get("master_replid", "")) != before.replid:
            raise FailedOver("Redis failed over before a replica confirmed these writes; they may be lost")
        waited = time.monotonic() - started
        if int(acked) >= 1:
            if warned:
                log.warning("a replica confirmed the writes after %.1f s", waited)
            return
        if not int(info.get("connected_slaves", 0)) and waited >= alone_after:
            log.warning("no replica for %.0f s: the primary goes on alone", waited)
            return
        if not warned:
            warned = True
            log.warning("no replica confirmed the writes within %d ms; waiting for one", wait_ms)
