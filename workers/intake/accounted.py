"""Where a pending prompt's message may be when it is not in its queue: the audit's reads per prompt.

A message that leaves its queue is taken by a worker: kombu records it as
unacknowledged, the task notes the delivery in the run's deliveries entry
(`Ledger.intake`, naming the worker) and the worker lists the prompt in its
heartbeat (`holding`) from just before that note until it settles it. So the
entry names every worker that may hold a prompt taken from its queue, and a
few reads per prompt tell whether one does, where the audit once read the
whole unacknowledged hash and every heartbeat (a gigabyte and seconds of
Redis at 10^6 prompts in flight). A prompt is accounted for when one of its
named workers

- is live and lists it (held), or
- is silent (dead, frozen, cut off) but was heard from within `window` (a
  lease, a restore sweep and audit rounds): its deliveries are still leased,
  or just restored to the queue, or
- is live but started within `window`: a worker restarted under the name of
  one that died holding the prompt, whose leases have not run out yet.

and, while kombu's sweep still has a message to bring back (`restores_pending`:
a lease that no worker has renewed for half a lease, whose worker died, hangs or
let it go), a silent worker accounts for its prompts whenever it was last heard
from: that message may be the prompt's, and the sweep puts it back on its queue.
The window alone cannot say so: a sweep can come late (the sweep's lock left by
a worker killed during its sweep holds every sweep off until the lock expires,
`unacked_mutex_expire`), and a worker's leases can outlive its last heartbeat.
An audit that republished such a prompt put it on its queue twice, once by
itself and once by the sweep (seen: a worker SIGKILLed after its heartbeats had
stopped, holding the sweep's lock; its 24 prompts republished, then restored).

Anything else is missing now: a prompt whose entry names no worker (none yet,
or only deliveries given back: its message taken and not yet noted, or given
back and not yet requeued, for milliseconds, or lost on its way), or whose
workers are long gone while it is not in its queue. The audit confirms a loss
only when its next round finds the prompt missing again, its entry as stored
unchanged (`stored_entries`; `audit.Suspects`).
"""
from __future__ import annotations

from typing import Iterable

import redis

from contract.ledger import deliveries
from contract.fleet import heartbeats
from contract.broker import worker_lease
from contract.redis_link.clock import CLOCK
from contract.keys import RunKeys

PAGE = 500  # fields per HMGET


def restores_pending(client: redis.Redis, now: float, lease_seconds: float) -> bool:
    """Whether some lease was not renewed for half a lease (a live worker renews its lease every
    quarter lease, `lease.py`), or some delivery's lease has lapsed: kombu's sweep will put a
    message back on its queue (`worker_lease.lapsing`)."""
    return worker_lease.lapsing(client, now, lease_seconds / 2)


def entries(client: redis.Redis, run: str, prompt_ids: list[str]) -> list[list[str]]:
    """The workers each prompt's deliveries entry names (none: no entry)."""
    return [deliveries.names(raw) for raw in stored_entries(client, run, prompt_ids)]


def stored_entries(client: redis.Redis, run: str, prompt_ids: list[str]) -> list[str]:
    """Each prompt's deliveries entry as stored ("": no entry), a page of HMGET at a time."""
    raws: list[bytes | None] = []
    for start in range(0, len(prompt_ids), PAGE):
        raws += client.hmget(RunKeys(run).deliveries, prompt_ids[start:start + PAGE])
    return [deliveries.as_text(raw) for raw in raws]


def accounted_for(client: redis.Redis, run: str, named: dict[str, list[str]], window: float,
                  restoring: bool = False) -> set[str]:
    """The prompts of `named` (prompt -> the workers its entry names, read before this) that a
    named worker holds, or may still hold (see above); `restoring`: `restores_pending` said so,
    before the prompts' queue was read. One heartbeat read per worker named; the registry's
    last-heard time only for those whose heartbeat has expired."""
    workers = sorted({name for names in named.values() for name in names})
    records = dict(zip(workers, heartbeats.read(client, workers)))
    silent = [w for w in workers if records[w] is None]
    seen = dict(zip(silent, heartbeats.last_seen(client, silent)))
    holding = {w: set((r.get("holding") or {}).get(run, ())) for w, r in records.items() if r is not None}
    now = CLOCK.now(client)
    return {pid for pid, names in named.items()
            if any(accounts(pid, records[w], holding.get(w, set()), seen.get(w), now, window, restoring)
                   for w in names)}


def accounts(prompt_id: str, record: dict | None, holding: Iterable[str], last_seen: float | None,
             now: float, window: float, restoring: bool = False) -> bool:
    """Whether a worker named in the prompt's entry holds it or may still hold it: `record` its
    live heartbeat (None: expired), `holding` the run's prompts that heartbeat lists, `last_seen`
    its last heartbeat's time (None: never heard of), all on Redis's clock; `restoring`: kombu's
    sweep has a message to bring back, which may be this prompt's."""
    if record is not None:
        return prompt_id in holding or now - float(record.get("started") or 0.0) < window
    return restoring or (last_seen is not None and now - last_seen < window)
