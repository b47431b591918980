"""A round of the audit looks at a bounded slice of a run: at most `FLEET_AUDIT_SLICE` pending
prompts, and about `FLEET_AUDIT_HEARTBEATS` heartbeats, whatever the fleet's size.

The audit judges a prompt that is not in its queue by the heartbeats of the
workers its deliveries entry names (`accounted.py`), one read per worker named.
A slice of pending prompts comes in hash order, so it names about as many
workers as it holds prompts, up to the whole fleet: a round that read a whole
slice read up to one heartbeat per worker. So a round reads pending prompts
from the pass's cursor a batch at a time, each batch with its entries, and stops
once it has read a slice of prompts or their entries name `FLEET_AUDIT_HEARTBEATS` workers;
the cursor (kept in Redis, `audit.AuditState`) stays where it stopped and the
next round goes on from there. Nothing is skipped: every prompt the cursor
passes was judged in its round, so a pass still looks at every prompt pending
throughout it, and a prompt missing at one round is looked at again at the
next (the suspects come first, and their workers count toward the bound). The
round stops at the page of `PAGE` prompts that reaches the bound, so it reads at
most `FLEET_AUDIT_HEARTBEATS` heartbeats plus those of the workers one page names (an entry
names 1 to `FLEET_MAX_DELIVERIES` workers, most of them one).

Why a bound on heartbeat reads rather than a cheaper read of each
(`python -m bench --parts fleet` and a probe of the same state, 1,000 simulated
workers, 256,000 prompts in flight, 2 shared cores): reading 1,000 heartbeats
(3.4 KB each) takes 1.8 ms of Redis as MGET pages of 50; a Lua script that
answers per (worker, prompt) whether the heartbeat lists it took 18 ms
(string.find in the record) to 58 ms (cjson.decode), since each reads the
record inside Redis anyway; the held prompts as a set per worker (SMISMEMBER,
4.7 ms) cost each heartbeat 73 us to write instead of 17, every health round of
every worker. Read whole, a heartbeat is cheap; only their number had to stop
growing with the fleet.

The price: where the fleet is larger than the bound, a round looks at fewer
prompts than a slice (about 700 at 1,000 workers and the default 500), so a pass
takes more rounds: the setting trades a round's cost for a pass's length.
"""
from __future__ import annotations

from typing import Iterable

import redis

from contract.ledger.deliveries import names
from contract.keys import WORKERS, task_id
from contract.ledger.ledger import Ledger

from .accounted import stored_entries

# Pending prompts per HSCAN step: the step reads each prompt's packed ids inside Redis (Redis 7.0
# has no NOVALUES) to return the names alone; 500 took 2-17 ms of Redis at 1-4 KB of ids a prompt
# (2 shared cores), 100 under about one.
PAGE = 100


class Slice:
    """What one round of a run judges: the prompts not in their queue (`queued`: their task ids
    read first), their deliveries entries as read (what `audit.Suspects` compares between two
    rounds), and the workers those name."""

    def __init__(self, client: redis.Redis, run: str, queued: set[str]):
        self.client, self.run, self.queued = client, run, queued
        self.candidates: dict[str, str] = {}    # every prompt judged this round, in order -> its entry as read
        self.named: dict[str, list[str]] = {}   # candidate -> the workers its entry names
        self.workers: set[str] = set()

    def add(self, prompt_ids: list[str]) -> None:
        """Judge these too, those of them not in their queue."""
        self._take(prompt_ids, self._entries(prompt_ids))

    def extend(self, ledger: Ledger, cursor: int, size: int, heartbeats: int) -> int:
        """Judge pending prompts from `cursor` on, a page at a time, until `size` were read or the
        workers named reach `heartbeats` (`FLEET_AUDIT_HEARTBEATS`); the cursor to go on from (0: the pass is
        over). The pages come in batches whose entries are read together, in order of id (as a
        whole slice's were: a third less Redis for HMGET at 100 workers in the bench, whose
        entries were written in that order, as a run's often are): the whole slice at once
        where the registry has fewer workers than the bound, else as many prompts as named the
        workers still to read so far. A batch's pages after the one that reached the bound are
        left to the next round."""
        bound = heartbeats
        few = self.client.zcard(WORKERS) < bound - len(self.workers)  # the registry names nearly every worker
        read = 0
        while read < size and len(self.workers) < bound:
            per_worker = read / len(self.workers) if read and self.workers else 1.0
            want = size - read if few else min(size - read, max(PAGE, int((bound - len(self.workers)) * per_worker)))
            pages = pending_pages(ledger, cursor, want)
            stored = self._entries(p for _, page in pages for p in page)
            for after, page in pages:
                self._take(page, stored)
                read, cursor = read + len(page), after
                if len(self.workers) >= bound:
                    break
            if cursor == 0:
                break
        return cursor

    def _entries(self, prompt_ids: Iterable[str]) -> dict[str, str]:
        """The entries of these prompts not judged yet and not in their queue."""
        fresh = sorted({p for p in prompt_ids if p not in self.candidates and task_id(self.run, p) not in self.queued})
        return dict(zip(fresh, stored_entries(self.client, self.run, fresh)))

    def _take(self, prompt_ids: Iterable[str], stored: dict[str, str]) -> None:
        for prompt_id in prompt_ids:
            if prompt_id in stored and prompt_id not in self.candidates:
                self.candidates[prompt_id] = stored[prompt_id]
                if workers := names(stored[prompt_id]):
                    self.named[prompt_id] = workers
                    self.workers.update(workers)


def pending_pages(ledger: Ledger, cursor: int, size: int) -> list[tuple[int, list[str]]]:
    """About `size` pending prompts from `cursor` on, as pages of HSCAN (whole pages: a step
    asking for fewer costs a script call all the same), each with the cursor after it (0: the
    pass is over)."""
    pages: list[tuple[int, list[str]]] = []
    while sum(len(page) for _, page in pages) < size:
        cursor, page = ledger.pending_page(cursor, PAGE)
        pages.append((cursor, page))
        if cursor == 0:
            break
    return pages
