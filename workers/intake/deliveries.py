"""Poison prompts end: a prompt whose deliveries keep dying with their worker becomes a dead letter.

A prompt that kills the worker holding it (out of memory, a crash in a native
library) raises nothing the task could catch: its worker dies, its lease runs
out, and the next worker takes it and dies too. So each time a worker starts a
prompt it records the delivery in Redis, naming itself, *before* generating
(`note`): a delivery that kills its worker stays counted. A prompt delivered
more than `FLEET_MAX_DELIVERIES` times without finishing is not generated
again but dead-lettered as `poison`, with the workers that held it.

A worker that dies takes every prompt it holds down with it, so a death counts
against all of them, the poison one and its bystanders alike; with one worker,
the same bystanders can be caught in every death. So the last allowed delivery
(`FLEET_MAX_DELIVERIES` earlier ones unfinished) runs *alone* among such
prompts in its worker (`tasks`), and is counted only once it starts: a
bystander waits its turn uncounted and finishes, while the poison prompt, when
its turn comes, kills its worker once more, with no other last-chance prompt
beside it, and is dead-lettered at its next delivery.

A delivery that ends without its worker dying is taken back (`undo`): no
healthy server (the task gives the prompt back), a SIGTERM hand-back, and an
unexpected error, which `FLEET_MAX_CRASHES` counts instead. So a server outage
or a rolling restart never poisons a good prompt, and what is left counted is
deliveries whose worker died holding them. A delivery taken back leaves a
count of those taken back in the entry, which no poison count reads: the
audit tells by it a prompt given back between two of its rounds from one
whose message is lost (`audit.Suspects`). A finished prompt's record is
dropped (`clear`; a stored one's by its group commit), so Redis keeps one
only for prompts in flight or given back, and a requeued dead letter starts afresh.

A delivery is taken back only by the process that counted it, and at most once
(`Started`): a worker restarted under the same name must not erase the record
of its predecessor's death.

One hash per run (`RunKeys.deliveries`): prompt id -> the workers it was
delivered to (`contract/ledger/deliveries.py`: the entry's format); the count is the
number of names. Each update is one Lua script, so concurrent deliveries of
one prompt never lose a name.
A delivery is usually noted by the script that reads the prompt's ids
(`Ledger.intake`, one round trip where reading, counting and noting took
three); `note` here serves the last allowed delivery, noted only once it runs
alone, and a delivery that first had to look for its sample in a shard.

**One generation at a time.** kombu takes a message off its queue (BRPOP)
before it records it as unacknowledged; a Redis crash in between, a failover,
or a frozen worker thawing after the audit republished its prompt can leave two
messages of a prompt. So each worker lists in its heartbeat the prompts it
holds (`Started.holding`: from just before its intake until it settles them,
less those whose lease it let run out), the audit counts a prompt so listed as
held, and a delivery whose note finds another worker listing the prompt in a
heartbeat written since (a live worker, then) is not started (`elsewhere`):
its note is taken back and its message acknowledged, while the prompt stays
with the worker generating it (whose own message brings it back if that worker
dies). A heartbeat written before the delivery is no proof of life: a killed
worker's last one outlives it by a heartbeat's life, maybe past its lease, and
the message its lease handed back is then the prompt's only one; so a delivery
that finds only such a heartbeat waits for the next (one health round for a
live worker) or for it to expire, and then generates the prompt. A named
worker with no heartbeat at all is dead, except just after a Redis restart: an
outage longer than a heartbeat's life lost the live workers' heartbeats too,
until their writes, backing off, get through; so a name with none written since
Redis came back is waited for until Redis has been up a heartbeat's life (a
live worker writes one each health round, listing the prompt), and only then
is the prompt generated here.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import redis

from contract.ledger import deliveries as entry
from contract.fleet import heartbeats
from contract.redis_link.clock import CLOCK
from contract.keys import RunKeys
from contract.ledger.ledger import DEAD, DONE, Ledger
from contract.redis_link.scripts import Lua

log = logging.getLogger(__name__)

_NOTE = Lua("""
return deliver(KEYS[1], a.id, redis.call('HGET', KEYS[1], a.id), a.worker)
""", prelude=entry.LUA, head=("id", "worker"))
_HOLD = Lua("""
if redis.call('HEXISTS', KEYS[2], a.id) == 0 then return 0 end
local entry = redis.call('HGET', KEYS[1], a.id)
for _, name in ipairs(delivered(entry)) do if name == a.worker then return 0 end end
deliver(KEYS[1], a.id, entry, a.worker)
return 1
""", prelude=entry.LUA, head=("id", "worker"))
_UNDO = Lua("""
return take_back(KEYS[1], a.id, a.worker)
""", prelude=entry.LUA, head=("id", "worker"))


def note(client: redis.Redis, run: str, prompt_id: str, worker: str) -> list[str]:
    """Record a delivery of the prompt to `worker`; returns every worker it was delivered to,
    oldest first, this one last."""
    held = _NOTE(client, [RunKeys(run).deliveries], {"id": prompt_id, "worker": worker})
    return entry.names(held)


def hold(client: redis.Redis, run: str, prompt_id: str, worker: str) -> bool:
    """After a failover: the prompt, still to be stored (its ids are in the ledger), is noted as
    delivered to `worker`, which holds it, unless it is noted so already (the note written to
    the old primary may be lost); True if it had to be noted again."""
    keys = RunKeys(run)
    return bool(_HOLD(client, [keys.deliveries, keys.token_ids], {"id": prompt_id, "worker": worker}))


def undo(client: redis.Redis, run: str, prompt_id: str, worker: str) -> None:
    """Take back `worker`'s latest delivery: it ended without its worker dying. Best effort: it is
    called on the way out of a failure, and a delivery left counted only errs towards caution."""
    try:
        _UNDO(client, [RunKeys(run).deliveries], {"id": prompt_id, "worker": worker})
    except redis.RedisError as exc:
        log.warning("could not take back a delivery of prompt %s of run %s: %r", prompt_id, run, exc)


def clear(client: redis.Redis, run: str, *prompt_ids: str) -> None:
    """The prompts finished (stored or dead-lettered): forget their deliveries (one call;
    `client` may be a pipeline, as a group commit's is)."""
    if prompt_ids:
        client.hdel(RunKeys(run).deliveries, *prompt_ids)


def holders(client: redis.Redis, run: str, prompt_id: str) -> list[str]:
    return entry.names(client.hget(RunKeys(run).deliveries, prompt_id))


class Started:
    """The deliveries this process counted and has not settled yet, so that each is taken back
    at most once, and only by the process that counted it (the task, or the SIGTERM hand-back)."""

    def __init__(self) -> None:
        self._mine: Counter[tuple[str, str]] = Counter()
        self._taking: Counter[tuple[str, str]] = Counter()  # intakes in progress
        self._let_go: set[tuple[str, str]] = set()  # held past their lease: another worker may start them
        self._lock = threading.Lock()

    @contextmanager
    def taking(self, run: str, prompt_id: str) -> Iterator[None]:
        """Around an intake: the prompt counts as held from before its note is written, so a
        heartbeat written after the note lists it (`elsewhere` relies on that order)."""
        with self._lock:
            self._taking[(run, prompt_id)] += 1
        try:
            yield
        finally:
            with self._lock:
                self._taking[(run, prompt_id)] -= 1
                if not self._taking[(run, prompt_id)]:
                    del self._taking[(run, prompt_id)]

    def holding(self) -> dict[str, list[str]]:
        """Run -> the prompts this process holds, for its heartbeat."""
        with self._lock:
            return _by_run((set(self._mine) | set(self._taking)) - self._let_go)

    def noted(self) -> dict[str, list[str]]:
        """Run -> the prompts this process holds whose intake is over, each delivery noted
        (those of intakes in progress are noted, if at all, by their intake: `confirmed_intake`)."""
        with self._lock:
            return _by_run(set(self._mine) - self._let_go)

    def holds(self, run: str, prompt_id: str) -> bool:
        with self._lock:
            key = (run, prompt_id)
            return (self._mine[key] > 0 or self._taking[key] > 0) and key not in self._let_go

    def let_go(self, run: str | None, prompt_id: str | None) -> None:
        """Its lease is left to run out (held too long): no longer listed as held here."""
        if run is not None and prompt_id is not None:
            with self._lock:
                self._let_go.add((run, prompt_id))

    def start(self, client: redis.Redis, run: str, prompt_id: str, worker: str) -> None:
        note(client, run, prompt_id, worker)
        self.counted(run, prompt_id)

    def counted(self, run: str, prompt_id: str) -> None:
        """A delivery noted in Redis for this process (by `start`, or by `Ledger.intake`)."""
        with self._lock:
            self._mine[(run, prompt_id)] += 1

    def take_back(self, client: redis.Redis, run: str, prompt_id: str, worker: str) -> None:
        if self._settle(run, prompt_id):
            undo(client, run, prompt_id, worker)

    def finish(self, client: redis.Redis, run: str, prompt_id: str, cleared: bool = False) -> None:
        """`cleared`: its record went already (a group commit clears its prompts')."""
        self._settle(run, prompt_id)
        if not cleared:
            clear(client, run, prompt_id)

    def _settle(self, run: str, prompt_id: str) -> bool:
        with self._lock:
            if self._mine[(run, prompt_id)] <= 0:
                self._mine.pop((run, prompt_id), None)
                return False
            self._mine[(run, prompt_id)] -= 1
            if not self._mine[(run, prompt_id)]:
                del self._mine[(run, prompt_id)]
                self._let_go.discard((run, prompt_id))
            return True


def _by_run(keys: set[tuple[str, str]]) -> dict[str, list[str]]:
    held: dict[str, list[str]] = {}
    for run, prompt_id in sorted(keys):
        held.setdefault(run, []).append(prompt_id)
    return held


STARTED = Started()


def settled_meanwhile(client: redis.Redis, run: str, prompt_id: str, worker: str,
                      held_by: list[str]) -> str | None:
    """The prompt's state if another worker named in `held_by` stored it (or dead-lettered it) since
    this delivery's intake was read: `elsewhere` waits for that worker's next heartbeat, which no
    longer lists a prompt it settled meanwhile, and the intake read before the wait still said
    queued (seen: an audit's second message of a prompt another worker was committing, generated
    and stored twice). Read only when another worker is named: no one else can have settled it."""
    if not any(name != worker for name in held_by):
        return None
    return settled(client, run, prompt_id)


def settled(client: redis.Redis, run: str, prompt_id: str) -> str | None:
    """The prompt's state if it is stored or dead-lettered (done, dead), else None."""
    state = Ledger(client, run).state(prompt_id)
    return str(state) if state in (DONE, DEAD) else None


def elsewhere(client: redis.Redis, run: str, prompt_id: str, worker: str, held_by: list[str],
              patience: float) -> str | None:
    """The live worker, other than this process, already generating the prompt, if one is.

    `held_by`: the names its note held before this delivery's (`Ledger.intake`). Only a
    worker named there can be generating it, and it is if a heartbeat of its written after
    this call began lists the prompt (one dated after `since` lists every prompt whose note
    came before this one; both dates are bounds on Redis's clock, `clock.py`). A heartbeat
    written before then is no proof: a worker SIGKILLed (an eviction, the OOM killer) leaves
    its last heartbeat, listing what it held, for a heartbeat's life, and where that outlives
    its lease (a short `FLEET_LEASE_SECONDS`) the message its lease gave back is the prompt's
    only one: taken for a duplicate and acknowledged, it was lost until the audit (issue 43).
    So each named worker's next heartbeat is waited for, until its present one expires
    (`patience`: a heartbeat's time to live): a live worker writes one every health round,
    a heartbeat late by a failover's retries is still a live worker's (going ahead without
    it would generate the prompt twice), and a worker that writes none by then is dead or
    frozen past its heartbeat, whose prompts are another's to generate, as its lease says.
    A name with no heartbeat at all, none of it heard since Redis came back less than `patience`
    ago (a restart after an outage longer than a heartbeat's life: a live worker's heartbeat is
    gone until its writes, backing off, get through), is waited for until Redis has been up
    `patience` (a live worker's second message taken then was generated twice).
    A name that is this worker's is a predecessor's (a restart under the same name: a second
    message of a prompt this process holds is found before its intake, with `STARTED.holds`)."""
    others = [name for name in dict.fromkeys(held_by) if name != worker]
    if not others:
        return None
    since = CLOCK.latest(client)
    deadline = time.monotonic() + patience
    # A Redis that came back moments ago (a restart) lost every heartbeat its outage outlived,
    # a live worker's too, until its writes, backing off, get through: a name that wrote none
    # since is waited for until Redis has been up a heartbeat's life (`patience`)
    silent_until = deadline - patience + max(0.0, patience - (up := _up_for(client)))
    silent = set(_silent_since(client, others, since - up - 1)) if up < patience else set()  # whole seconds
    while True:
        records = heartbeats.read(client, others)
        fresh = [r for r in records if r is not None and r["at"] > since]
        for record in fresh:
            if prompt_id in (record.get("holding") or {}).get(run, ()):
                return record["worker"]
        waited = [n for n, r in zip(others, records) if (r is not None and r["at"] <= since)
                  or (r is None and n in silent and time.monotonic() < silent_until)]
        if not waited or time.monotonic() > deadline:
            present = [r for r in records if r is not None]
            why = ("no heartbeat left" if not present and not silent else
                   f"none written since Redis came back {up:.0f}s before" if not present else
                   "a newer heartbeat does not list it" if not waited else
                   f"no newer heartbeat within {patience:.0f}s")
            log.info("prompt %s of run %s was delivered to %s before, not generating it now (%s): generated here",
                     prompt_id, run, ", ".join(others), why)
            return None
        time.sleep(0.2)


def _up_for(client: redis.Redis) -> float:
    """Seconds since Redis (this primary) started."""
    return float(client.info("server").get("uptime_in_seconds", 0))


def _silent_since(client: redis.Redis, names: list[str], started: float) -> list[str]:
    """The names whose last heartbeat (the registry's score) is older than `started` (Redis's
    start, on its clock), or unknown: none of theirs reached this Redis since it came back."""
    return [n for n, at in zip(names, heartbeats.last_seen(client, names)) if at is None or at < started]
