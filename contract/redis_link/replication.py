"""Writes confirmed on a replica before they are reported: what a failover may not lose.

Redis replicates asynchronously, so a replica promoted by Sentinel can lack the
last writes its old primary acknowledged. `WAIT 1 <ms>` blocks until a replica
has the writes of the connection that sends it, and the fleet writes on many
connections (the ledger's pool, kombu's publishing channel), so `replicated`
confirms them all at once with a barrier: one INCR of `REPLICATED`, sent
after the caller's writes were answered, and `WAIT` on the same connection
(one pipeline). The replication stream is ordered, so a replica that has the
barrier has every write the primary answered before it. Writes that fit one
pipeline go with their barrier in it (`confirmed`): one round trip, on one
connection, so on one server.

It also catches the failover itself, two ways:
- the primary's replication id (`master_replid`) changes when a replica is
  promoted, so one read before the writes and one after the barrier, on the
  primary of the moment, tell whether the writes and the confirmation met the
  same primary;
- an old primary still takes writes after its replica was promoted (a
  `SENTINEL FAILOVER` leaves it a primary until the Sentinels demote it, some
  seconds later; a primary frozen past `down-after-milliseconds` wakes up one)
  and keeps its replication id, but it has lost its replicas: so a barrier
  that reaches fewer replicas than the primary had (`_had`, per replication
  id, as this process saw it), while fewer are attached, is a refusal, not a
  confirmation. The client
  asks the Sentinels where the primary is (dropping its connections to the
  old one, `moved`), and if it moved, raises `FailedOver`.

Either way the caller reports nothing as done (the writes may be gone) and
writes again: on the new primary (`written_again`). A Sentinel-managed
primary seen without any replica (by a process that started after it lost
them) is asked about the same way (`_still_named`).

What a primary had is every replica this process saw attached to it, by
address (not the most it saw at once: a replica that joined unseen must not
stand in for the one seen and promoted since), and every one that attached
and left again between two of its looks (`_unseen`): once some primary had
replicas (`_watching`), each look also reads the primary's attach counters
(`INFO stats`: `sync_full` + `sync_partial_ok`) in the same round trip, and
a rise since the last look at that replication id, beyond the replicas
attached now that were not then, is such a replica. Both are windows of a
second switchover just after the first healed: the old primary joins the
new one as a replica unseen, and it (or the replica seen) is promoted before
this process writes there again; with one replica the primary left behind
would otherwise look like one that never had any, trusted while the
Sentinels still name it. Not seen: a replica that came and went before this
process's first look at that primary (`_still_named` alone guards that). A
replica whose link dropped and came back between two looks, or a
`redis-cli --rdb`, reads as one gone too: writes wait for the Sentinels, at
most `ALONE_AFTER`, once.

A primary without replicas has nothing to wait for (a `WAIT 1` there would
only time out), so a plain single Redis pays one `INFO replication` per
call (never `INFO stats`: no primary it saw had replicas); a caller that
writes per prompt confirms only where `expected` says some primary this
process saw had replicas (one `INFO` at its first call), so there it pays
nothing. A replica that lags holds the call (and the
caller waits: back-pressure, not loss) until it catches up; a primary left
with fewer replicas than it had, and still the one the Sentinels name, is
trusted with those left (or alone) only after `ALONE_AFTER` seconds, longer
than Sentinel takes to name a promoted replica or to demote an old primary
that comes back (whose writes of that moment it discards): a replica still
attached to it acknowledges writes that its resync from the promoted one
will drop. WAIT narrows the loss window to nothing
that was reported; it does not make Redis a consensus store (a replica that
has the write can still lose the election), which is why every transition is
also repaired after the fact (`workers/intake/failover.py`, the audit, reconcile).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NamedTuple, TypeVar

import redis

from contract.keys import REPLICATED

log = logging.getLogger(__name__)
WAIT_MS = 1000  # one WAIT's bound; the call sends another while unconfirmed
ALONE_AFTER = 15.0  # seconds without replicas after which a primary that had some is trusted alone
AGAIN = 5  # writes of one step across failovers met one after another
T = TypeVar("T")


class FailedOver(redis.ConnectionError):
    """The primary changed between the writes and their confirmation: they may be lost."""


class Primary(NamedTuple):
    replid: str
    replicas: int


_had: dict[str, int] = {}  # replication id -> the replicas that primary had, as this process knows
# replication id -> the replicas (ip:port) seen attached to that primary: a replica that joined
# unseen and the one seen, promoted meanwhile, are one replica at once but two it had
_attached_to: dict[str, set[str]] = {}
# replication id -> (its primary's attaches: sync_full + sync_partial_ok, the replicas attached) at
# this process's last look with the attach counters: a replica that attached and left again between
# two looks (promoted) is seen only there
_looked: dict[str, tuple[int, frozenset[str]]] = {}
# replication id -> (replicas attached, since when: monotonic) while it has fewer than it had; a
# change in the number attached starts the wait again
_short_since: dict[str, tuple[int, float]] = {}
_last_replicas = [0]  # replicas of the primary last seen: whether `confirmed` sends a WAIT that waits


def primary(client: redis.Redis) -> Primary:
    """Who the primary is (its replication id) and how many replicas it has now. A Redis that
    refuses INFO (an ACL without it) is taken as one without replicas, and said so once."""
    try:
        if _watching():
            with client.pipeline(transaction=False) as pipe:
                looks = _look(pipe)
                info = _read(pipe.execute(), looks)
        else:
            info = client.info("replication")
    except redis.ResponseError as exc:
        if not _refused:
            _refused.append(exc)
            log.warning("Redis refuses INFO (%s): writes are not confirmed on a replica", exc)
        return Primary("", 0)
    return _seen(info)


def expected(client: redis.Redis) -> bool:
    """Whether this process's writes have replicas to reach: some primary it saw had some (asked
    once, with one INFO, before it saw any). A plain Redis without replicas answers False from
    then on, so a caller that confirms only where this is True costs it nothing more."""
    if not _had and not _refused:
        primary(client)
    return _watching()


def had(who: Primary) -> int:
    """How many replicas this primary had: what a barrier must reach. What this process knows
    now, not what `who` saw: a replica found lost for good by any caller lowers it for every
    caller still waiting (`_enough`), or they would wait for it for ever."""
    return _had.get(who.replid, who.replicas)


def _watching() -> bool:
    """Whether some primary this process saw had replicas: then each look also reads the primary's
    attach counters (a plain Redis without replicas is never asked for them)."""
    return any(_had.values())


def _look(pipe: Any) -> int:
    """This process's look at the primary, queued on `pipe`: `INFO replication`, and where replicas
    are watched (`_watching`) `INFO stats` (its attach counters) in the same round trip; returns
    how many replies it adds."""
    pipe.info("replication")
    if not _watching():
        return 1
    pipe.info("stats")
    return 2


def _read(replies: list, looks: int) -> dict:
    """The look `_look` queued (the last `looks` replies), as one INFO dict."""
    info: dict = {}
    for reply in replies[len(replies) - looks:]:
        info.update(reply)
    return info


def _replicas_in(info: dict) -> set[str]:
    """The replicas attached to a primary, by address, as its `INFO replication` lists them."""
    return {f"{v.get('ip')}:{v.get('port')}" for k, v in info.items()
            if k.startswith("slave") and k[5:].isdigit() and isinstance(v, dict)}


def _unseen(replid: str, info: dict, attached: set[str]) -> int:
    """Replicas that attached to this primary since this process's last look at it and are gone
    again (one promoted meanwhile): its attaches (`INFO stats`: full and partial syncs it served)
    rose by more than the replicas attached now that were not at that look. A first look (or
    counters reset) has nothing to compare with; a look without the counters changes nothing."""
    if "sync_full" not in info or info.get("role") != "master":
        return 0
    attaches = int(info["sync_full"]) + int(info.get("sync_partial_ok", 0))
    last = _looked.get(replid)
    _looked[replid] = (attaches, frozenset(attached))
    if last is None or attaches < last[0]:
        return 0
    unseen = max(0, attaches - last[0] - len(attached - last[1]))
    if unseen:
        log.warning("the primary served %d replica attaches since this process last looked, %d more than the "
                    "replicas attached since: counted among those it had", attaches - last[0], unseen)
    return unseen


def _seen(info: dict) -> Primary:
    who = Primary(str(info.get("master_replid", "")), int(info.get("connected_slaves", 0)))
    _last_replicas[0] = who.replicas
    attached = _replicas_in(info)
    known = _attached_to.setdefault(who.replid, set())
    known |= attached
    # What it had is every replica seen attached to it, not the most seen at once (the count alone
    # takes a replica that joined unseen for the one seen, promoted meanwhile), and those listed
    # now plus every one that attached unseen and left again (`_unseen`). Listed, not counted: a
    # primary resumed after a freeze counts a dead replica link it no longer lists.
    most = max(who.replicas, len(known), len(attached) + _unseen(who.replid, info, attached))
    if most >= _had.get(who.replid, 0):
        _had[who.replid] = most
    if who.replicas and who.replicas >= _had[who.replid]:  # as many as it had: none is missing
        _short_since.pop(who.replid, None)
    return who


_refused: list[Exception] = []


@contextmanager
def replicated(client: redis.Redis, wait_ms: int = WAIT_MS) -> Iterator[None]:
    """Around writes that must survive a failover once they are reported: returns only when
    a replica has them (or the primary has none, and never had), raises `FailedOver` when a
    failover may have lost them."""
    before = primary(client)
    yield
    if had(before):
        confirm(client, before, wait_ms)
    else:
        _still_named(client, before)


def confirmed(client: redis.Redis, fill: Callable[[Any], None], wait_ms: int = WAIT_MS,
              alone_after: float = ALONE_AFTER) -> list:
    """The writes `fill` queues on a pipeline, sent with their barrier in one round trip
    (one connection, one server: no read of the primary before them is needed); returns their
    replies once a replica has them, as `replicated` does, or raises `FailedOver`."""
    waits = _last_replicas[0] > 0  # a primary without replicas (a new one, before its replica is back) never waits
    with client.pipeline(transaction=False) as pipe:
        fill(pipe)
        pipe.incr(REPLICATED)
        pipe.execute_command("WAIT", 1 if waits else 0, wait_ms if waits else 0)
        looks = _look(pipe)  # the primary as it was when the WAIT answered
        got = pipe.execute()
    *replies, _, acked = got[:len(got) - looks]
    info = _read(got, looks)
    here = _seen(info)
    if not had(here):
        _still_named(client, here)
    elif not _enough(client, here, int(acked), info, alone_after):
        confirm(client, here, wait_ms, alone_after)
    return replies


# What redis-py's Sentinel connection raises when the primary it still talks to answers READONLY:
# it was demoted, and the write was refused there (a replica takes none), so it is written again.
DEMOTED = "The previous master is now a slave"


def written_again(write: Callable[[], T], what: str, times: int = AGAIN) -> T:
    """`write` (confirmed) again while it meets a failover (each time on the primary the
    Sentinels name then), `times` times in all: a `FailedOver`, or a primary demoted under it
    (`DEMOTED`: seen in a double failover, a dead letter refused that way and its prompt
    generated again)."""
    for _ in range(times - 1):
        try:
            return write()
        except redis.ConnectionError as exc:
            if not isinstance(exc, FailedOver) and DEMOTED not in str(exc):
                raise
            log.warning("%s met a failover (%s); writing them again on the new primary", what, exc)
    return write()


def _still_named(client: redis.Redis, who: Primary) -> None:
    """A Sentinel-managed primary without replicas (as far as this process knows: it may have
    started after the primary lost them) is trusted only while the Sentinels still name it."""
    if hasattr(client.connection_pool, "get_master_address") and moved(client, who.replid):
        raise FailedOver("the primary that took these writes has no replica and is no longer the one "
                         "the Sentinels name; they may be lost")


def confirm(client: redis.Redis, before: Primary, wait_ms: int = WAIT_MS, alone_after: float = ALONE_AFTER) -> None:
    """The barrier and its WAIT, again until as many replicas as the primary had have it. Fewer
    is a refusal: if the Sentinels name another primary, `FailedOver`; if they still name this
    one after `alone_after` seconds, a replica lost for good, and the writes are confirmed by
    those left, or by none (a primary frozen and resumed, or one whose replica is being
    promoted, may only then be demoted by the Sentinels, discarding its writes)."""
    started = time.monotonic()
    warned = False
    while True:
        with client.pipeline(transaction=False) as pipe:
            pipe.incr(REPLICATED)
            pipe.execute_command("WAIT", max(1, had(before)), wait_ms)
            looks = _look(pipe)
            got = pipe.execute()
        acked, info = got[1], _read(got, looks)
        if str(info.get("master_replid", "")) != before.replid:
            raise FailedOver("Redis failed over before a replica confirmed these writes; they may be lost")
        _seen(info)
        if _enough(client, before, int(acked), info, alone_after):
            if warned:
                log.warning("a replica confirmed the writes after %.1f s", time.monotonic() - started)
            return
        if not warned:
            warned = True
            log.warning("no replica confirmed the writes within %d ms; waiting for one", wait_ms)


def _enough(client: redis.Redis, who: Primary, acked: int, info: dict, alone_after: float = ALONE_AFTER) -> bool:
    """Whether `acked` replicas are confirmation enough on this primary: all it had, or one while
    all are still attached (a lagging replica is not a failover). Fewer attached than it had,
    the Sentinels are asked: `FailedOver` if they name another primary."""
    want = had(who)
    connected = int(info.get("connected_slaves", 0))
    if acked >= want or (acked >= 1 and connected >= want):  # every replica still attached, one lagging
        return True
    if moved(client, who.replid):
        raise FailedOver(f"the primary that took these writes has {acked} of its {want} replicas and is no "
                         "longer the one the Sentinels name; they may be lost")
    # Fewer attached than it had, and the Sentinels still name it: a replica lost for good, or a
    # switchover whose promotion the Sentinels do not name yet. A replica left attached is no
    # proof: it is reconfigured to replicate the promoted one, and its copy of these writes goes
    # with the full resync that follows. So only `alone_after` without the Sentinels naming
    # another primary makes a replica lost for good, with or without one acknowledging.
    short = _short_since.get(who.replid)
    if short is None or short[0] != connected:
        short = _short_since[who.replid] = (connected, time.monotonic())
    since = short[1]
    if time.monotonic() - since >= alone_after:
        log.warning("%d of the %d replicas for %.0f s: the primary goes on with them", connected, want,
                    time.monotonic() - since)
        _had[who.replid] = connected  # a replica lost for good: the next writes wait for those left
        _attached_to[who.replid] = _replicas_in(info)  # and those it had are those attached now
        return True
    return False


def moved(client: redis.Redis, replid: str) -> bool:
    """Whether the primary behind `client` is no longer the one with `replid`: a Sentinel-managed
    pool asks the Sentinels first (and drops its idle connections to a replaced primary, so
    the next command reconnects to the new one)."""
    pool = client.connection_pool
    if hasattr(pool, "get_master_address"):
        try:
            pool.get_master_address()
        except redis.ConnectionError:  # no Sentinel answers: the primary did not move, as far as we know
            return False
    try:
        return primary(client).replid != replid
    except redis.ConnectionError:
        return True
