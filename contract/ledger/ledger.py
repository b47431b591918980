"""Where each prompt of a run stands: the one owner of a run's prompt keys.

The ledger holds, per run, each prompt's state, the token ids of those still
to do, the dead letters, the counts and the per-minute rates (the keys of
`RunKeys` but the spec and the crash counts). Nothing else writes them: every
change of a prompt's state is one Lua script (`ledger_scripts.py`), so it is
atomic (Redis runs a script alone) and conditional (each looks at the state it
finds):

    (none) -> queued   enqueue    a prompt the run does not have yet
    dead   -> queued   requeue    a dead letter replayed; the letter goes, the budget its
                                  message carries is kept (`budgets`: every delivery's
                                  intake reads it) until it settles
    queued -> done     mark_done  its sample is durable in a shard (mark_group_done:
                                  a whole group's, in one call)
    dead   -> done     mark_done  a redelivery succeeded after all; the letter goes
    queued -> dead     bury       its dead letter is stored
    dead   -> dead     bury       a redelivered failure replaces its letter
    done   -> done     anything   a stored prompt is never dead-lettered, re-queued or counted twice

A conversation's next turn enters the ledger through `conversation_ledger.py`,
whose scripts share this prelude: (none) -> queued (or -> dead, when its
prompt cannot be rendered) in the same atomic step that moves the
conversation past the turn before it.

Any other call is a no-op that returns the state it found, for the caller to
log. The counts by state (`state:queued|done|dead`), by dead-letter reason
(`reason:CODE`) and, in a run with a verifier, of stored samples by verdict class
(`verdict:pass|fail|error`, counted as each becomes done) are kept in the run's counters hash by the same scripts, so
`status` and `dead stats` read them in O(1) and they always add up:
queued + done + dead == enqueued. A dead letter exists exactly while its
prompt is dead (purging one keeps the prompt dead), so `dead list` never
names a stored prompt.

**Writing entries.** While a group's samples are being written, each of its
prompts has an entry naming the shard file (`writing`, `unwritten`); the
transitions to done or dead delete it, so the hash holds only groups in
flight, and an entry a dead worker left tells the prompt's next delivery
where its sample may already be (`intake`; workers/intake/reconcile.py).

**Compact states.** A run of 10^7 prompts keeps 10^7 states forever, so a
state costs ~21 bytes of Redis at 10^6 prompts (`python -m bench --parts
scale`), not the ~100 of a hash field per id. `locate` hashes the id (BLAKE2b,
80 bits): 15 bits pick one of `STATE_BUCKETS` small hashes, 64 bits are the
field (ids colliding in all 80 bits: ~1e-10 at 10^7 prompts). Small hashes
stay in Redis's listpack encoding, where a field costs its bytes plus two and
an integer value 2 to 6 bytes. The value is the state:

    q<call>   queued, by enqueue call <call> (`q` alone: requeued)
    d         dead
    <int>     done; the int is `shard_code` of the shard holding the prompt's
              canonical copy

A stored sample belongs to the dataset only while its prompt is done AND it
sits in that shard, so a prompt stored twice counts once, with no set of ids
anywhere (`export`). The same step counts, per shard code, the prompts whose
canonical copy the shard holds (`shards`, a field per shard), so `export`
knows in one read that a shard holds only canonical rows. `<call>` tells `enqueue` that a prompt it finds queued
was queued by an earlier line of the same call (a duplicate in the file), not
by another producer, without a set of the file's ids.

The bucket and field are computed here in Python and passed in, each bucket
as a declared key, so the scripts compute nothing from ids.

**One layout.** This module reads only what it writes: a run an older layout
wrote (one `state` hash keyed by id, counters without counts by state) is
refused before anything reads its ledger (`contract.run.spec.load_spec`), never
converted.

The producer writes a prompt's token ids and marks it queued before it
publishes the message (so a crash in between leaves a prompt the audit can
republish, never one that is lost). A re-run of `enqueue` skips every prompt
the ledger already has.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

import redis

from contract.ledger import deliveries, ledger_scripts as lua
from contract.redis_link.clock import CLOCK
from contract.ledger.codec import count_ids
from contract.keys import STATE_BUCKETS, RunKeys
from contract.names import PromptState
from contract.redis_link.scripts import Lua

QUEUED, DONE, DEAD = PromptState.QUEUED, PromptState.DONE, PromptState.DEAD
NEW, AGAIN = "new", "again"  # enqueue outcomes besides the state found
# Prompts per script call: a call runs alone on Redis, so it stays short (a group commit's DONE of
# 1,000 rows, or an enqueue's, took 8-11 ms: `python -m bench --parts fleet`; 250, 2-3 ms).
READ_CHUNK = 250
# One HSCAN step over the run's packed ids, returning the names alone (Redis 7.0 has no NOVALUES).
_PENDING_PAGE = Lua("""
local reply = redis.call('HSCAN', KEYS[1], a.cursor, 'COUNT', a.count)
local names, entries = {}, reply[2]
for i = 1, #entries, 2 do names[#names + 1] = entries[i] end
return {reply[1], names}
""", head=("cursor", "count"))


class Intake(NamedTuple):
    """A delivery's view of its prompt (`Ledger.intake`)."""
    ids: bytes | None           # packed token ids; None once done or dead, or forgotten
    writing: str | None         # the shard its sample was being written to, while it has ids
    held_by: list[str]          # the workers it was delivered to before (read when noting)
    noted: bool                 # this delivery is noted, naming the worker
    budget: int | None = None   # the max_new_tokens its last `dead requeue` gave it, while queued

    @classmethod
    def read(cls, reply: list) -> "Intake":
        """The intake script's reply (`Ledger.intake`)."""
        raw, shard, held, noted, budget = reply
        return cls(raw, shard.decode() if shard is not None else None, deliveries.names(held), bool(noted),
                   int(budget) if budget else None)


def locate(prompt_id: str) -> tuple[int, bytes]:
    """A prompt's state bucket (15 bits) and field (64 bits), from BLAKE2b of its id."""
    digest = hashlib.blake2b(prompt_id.encode("utf-8", "surrogatepass"), digest_size=10).digest()
    return int.from_bytes(digest[:2], "big") % STATE_BUCKETS, digest[2:]


def shard_code(shard: str | Path) -> int:
    """The code a done prompt's state holds for the shard of its canonical copy: 4 bytes
    of BLAKE2b of the shard's file name (not its folder, which may move)."""
    digest = hashlib.blake2b(Path(shard).name.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class Entry:
    """One prompt's state as the ledger holds it."""
    state: str | None = None   # queued | done | dead; None: not in the run
    shard: int | None = None   # done: `shard_code` of its canonical copy's shard
    call: str | None = None    # queued: the enqueue call that queued it ('' if requeued)

    @classmethod
    def decode(cls, raw: bytes | None) -> "Entry":
        if not raw:
            return cls()
        if raw[:1] == b"q":
            return cls(QUEUED, call=raw[1:].decode())
        if raw[:1] == b"d":
            return cls(DEAD)
        return cls(DONE, shard=int(raw))


@dataclass(frozen=True)
class Tally:
    """A run's counts as the transitions keep them (O(1) to read)."""
    enqueued: int = 0
    queued: int = 0
    done: int = 0
    dead: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # dead letters by reason
    prompt_tokens: int = 0
    output_tokens: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)  # stored samples by verdict class (pass, fail, error)
    prompts: int | None = None  # distinct prompts of a run of several samples a prompt; None: as many as enqueued

    @classmethod
    def from_counters(cls, counters: dict[str, int]) -> "Tally":
        return cls(enqueued=counters.get("enqueued", 0), queued=counters.get("state:queued", 0),
                   done=counters.get("state:done", 0), dead=counters.get("state:dead", 0),
                   reasons={k[7:]: v for k, v in sorted(counters.items()) if k.startswith("reason:") and v > 0},
                   prompt_tokens=counters.get("prompt_tokens", 0), output_tokens=counters.get("output_tokens", 0),
                   verdicts={k[8:]: v for k, v in sorted(counters.items()) if k.startswith("verdict:") and v > 0},
                   prompts=counters.get("prompts"))

    def by_state(self) -> dict[str, int]:
        return {str(s): n for s, n in ((QUEUED, self.queued), (DONE, self.done), (DEAD, self.dead)) if n}


class Ledger:
    def __init__(self, client: redis.Redis, run: str):
        self.client, self.run, self.keys = client, run, RunKeys(run)

    # -- reads ------------------------------------------------------------------------------

    def entries(self, prompt_ids: list[str]) -> list[Entry]:
        """Each prompt's entry, one script call per `READ_CHUNK` prompts."""
        return [Entry.decode(raw) for raw in self.raw_entries(prompt_ids)]

    def raw_entries(self, prompt_ids: list[str]) -> list[bytes | None]:
        """Each prompt's state as stored (`Entry.decode` reads it; a done prompt's is
        `b"%d" % shard_code(shard)`), one script call per `READ_CHUNK` prompts."""
        return [raw for reply in self._in_chunks(lua.READ, prompt_ids, [()] * len(prompt_ids)) for raw in reply]

    def states(self, prompt_ids: list[str]) -> list[str | None]:
        return [e.state for e in self.entries(prompt_ids)]

    def state(self, prompt_id: str) -> str | None:
        return self.states([prompt_id])[0]

    def canonical_rows(self, shard: str | Path) -> int:
        """How many prompts name `shard` as the holder of their canonical copy. A shard of
        that many rows holds only canonical rows: each such prompt has a row in it, so its
        rows are those prompts, once each (barring a 2^-32 collision of shard codes)."""
        return int(self.client.hget(self.keys.shards, shard_code(shard)) or 0)

    def pending_page(self, cursor: int = 0, count: int = 500) -> tuple[int, list[str]]:
        """A page of the prompts whose ids are still held (queued, in flight, or lost in transit):
        one HSCAN step from `cursor`, names only (the ids stay in Redis), and the next cursor (0:
        the pass is over). A prompt pending throughout a pass comes at least once."""
        cursor, names = _PENDING_PAGE(self.client, [self.keys.token_ids], {"cursor": cursor, "count": count})
        return int(cursor), [name.decode() for name in names]

    def pending(self, prompt_ids: list[str], page: int = 500) -> list[bool]:
        """Whether each prompt's ids are still held, a pipeline of HEXISTS per `page` of them."""
        found: list[bool] = []
        for start in range(0, len(prompt_ids), page):
            with self.client.pipeline(transaction=False) as pipe:
                for prompt_id in prompt_ids[start:start + page]:
                    pipe.hexists(self.keys.token_ids, prompt_id)
                found += [bool(x) for x in pipe.execute()]
        return found

    def letter(self, prompt_id: str) -> bytes | None:
        """A dead prompt's dead letter (JSON), while it has one."""
        return self.client.hget(self.keys.dead, prompt_id)

    def letters(self, page: int = 500) -> Iterator[tuple[str, bytes]]:
        """Every dead letter as (prompt id, JSON), a page of HSCAN at a time (a letter purged
        or replayed meanwhile may be missed, one present throughout comes at least once)."""
        for prompt_id, raw in self.client.hscan_iter(self.keys.dead, count=page):
            yield prompt_id.decode(), raw

    def tally(self) -> Tally:
        return Tally.from_counters(self.counters())

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.keys.counters).items()}

    def counts(self) -> dict[str, int]:
        """Prompts by state, counted from the ledger's own entries: a slow check of `tally`."""
        counts: dict[str, int] = {}
        for raw in self._all_values():
            state = Entry.decode(raw).state
            counts[state] = counts.get(state, 0) + 1
        return counts

    def _all_values(self, page: int = 256) -> Iterator[bytes]:
        keys = self.client.scan_iter(match=f"{self.keys.state_prefix}*", count=1000)
        while chunk := [k for _, k in zip(range(page), keys)]:
            with self.client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.hvals(key)
                for values in pipe.execute():
                    yield from values

    def recent(self, minutes: int = 5) -> tuple[int, int, float]:
        """Samples and output tokens stored in the current minute and the `minutes - 1`
        before it, and the seconds that window spans so far."""
        now = CLOCK.now(self.client)  # minutes are counted on Redis's clock (mark_stored)
        current = int(now // 60)
        fields = [f"{m}:{k}" for m in range(current - minutes + 1, current + 1) for k in ("samples", "tokens")]
        values = [int(v or 0) for v in self.client.hmget(self.keys.minutes, fields)]
        return sum(values[0::2]), sum(values[1::2]), (minutes - 1) * 60 + (now - current * 60)

    # -- transitions ------------------------------------------------------------------------

    # On a pipeline (`pipe`), a transition returns None, and the pipeline's replies hold what it
    # would have returned, one reply per `READ_CHUNK` of prompts (`outcomes` and `found` read them).

    def enqueue(self, payloads: dict[str, bytes] | list[tuple[str, bytes]], call: int | str = "",
                pipe: redis.client.Pipeline | None = None, firsts: list[bool] | None = None) -> list[str] | None:
        """New prompts become queued with their packed ids, by enqueue call `call`, one script
        call per `READ_CHUNK` of them. Returns, per (id, packed ids) in order, NEW, AGAIN
        (queued earlier by this same call, in this list or before) or the state it found (left
        as it is). `firsts` (a run of several samples a prompt, where the ids are samples' keys):
        which keys are a prompt's sample 0, each counted in `prompts` too when new, in the same step."""
        items = list(payloads.items()) if isinstance(payloads, dict) else list(payloads)
        flags = ["1" if f else "" for f in firsts] if firsts is not None else [""] * len(items)
        records = [(pid, raw, count_ids(raw), flag) for (pid, raw), flag in zip(items, flags)]
        replies = self._in_chunks(lua.ENQUEUE, [pid for pid, _ in items], records, {"call": call}, pipe)
        return None if pipe is not None else self.outcomes(replies)

    @staticmethod
    def outcomes(replies: list[list[bytes]]) -> list[str]:
        """What `enqueue` found, from its calls' replies."""
        return [r.decode() for reply in replies for r in reply]

    @staticmethod
    def found(replies: list[list[bytes]]) -> list[str | None]:
        """The states `mark_group_done` found, from its calls' replies."""
        return [r.decode() or None for reply in replies for r in reply]

    def requeue(self, payloads: dict[str, bytes], pipe: redis.client.Pipeline | None = None,
                budgets: dict[str, int | None] | None = None) -> list[str] | None:
        """Dead prompts become queued again with their packed ids, and lose their letters;
        returns the ids that moved (a prompt that is not dead is left as it is). `budgets`: the
        max_new_tokens each one's message carries, kept while it is queued (`budgets`)."""
        given = budgets or {}
        records = [(pid, ids, str(given.get(pid) or "")) for pid, ids in payloads.items()]
        replies = self._in_chunks(lua.REQUEUE, list(payloads), records, pipe=pipe)
        if pipe is not None:
            return None
        return [pid for pid, moved in zip(payloads, (m for reply in replies for m in reply)) if moved]

    def mark_done(self, prompt_id: str, output_tokens: int, shard: str | Path,
                  pipe: redis.client.Pipeline | None = None, verdict: str | None = None) -> str | None:
        """The prompt's sample is durable in `shard` (its canonical copy, unless the prompt
        was done already); returns the state it was in (done: nothing changed; None: not in
        the run, or on `pipe`). `verdict`: its verdict class, counted if it becomes done."""
        found = self.mark_group_done([(prompt_id, output_tokens, verdict)], shard, pipe)
        return None if found is None else found[0]

    def mark_group_done(self, samples: list[tuple], shard: str | Path,
                        pipe: redis.client.Pipeline | None = None) -> list[str | None] | None:
        """A group's samples, (prompt id, output tokens) or (prompt id, output tokens, verdict
        class) each, are durable in `shard`: one script call per `READ_CHUNK` of them (a group
        commit's whole ledger step). A sample's verdict class (pass, fail, error:
        `contract.run.verifiers.verdict_class`) is counted in `verdict:<class>` by the same step that
        makes it done, so once whatever the retries. Returns the state each prompt was in, as
        `mark_done` does."""
        head = {"minute": int(CLOCK.now(self.client) // 60), "code": shard_code(shard)}
        records = [(s[0], s[1], (s[2] if len(s) > 2 else None) or "") for s in samples]
        replies = self._in_chunks(lua.DONE, [s[0] for s in samples], records, head, pipe)
        return None if pipe is not None else self.found(replies)

    def bury(self, prompt_id: str, reason: str, letter: str, forgotten: bool = False) -> str | None:
        """Store the prompt's dead letter; returns the state it was in. Only a queued or dead
        prompt gets a letter: a done one (or one the run does not have) is left as it is, unless
        `forgotten`: a prompt whose message is queued but whose ledger entries Redis lost (evicted,
        flushed) is buried as the queued prompt it was."""
        buckets, fields = self.locations([prompt_id])
        head = {"field": fields[0], "id": prompt_id, "reason": str(reason), "letter": letter,
                "forgotten": "forgotten" if forgotten else ""}
        return self.call(lua.BURY, buckets, head).decode() or None

    def purge(self, prompt_ids: list[str]) -> int:
        """Delete dead letters; their prompts stay dead. Returns how many were deleted."""
        return sum(int(self.call(lua.PURGE, [], each=[(pid,) for pid in prompt_ids[start:start + READ_CHUNK]]))
                   for start in range(0, len(prompt_ids), READ_CHUNK))

    # -- writing entries: a group commit's samples, from just before the write until done --

    def writing(self, prompt_ids: list[str], shard: str) -> None:
        """These prompts' samples are about to be written to the shard file named `shard`
        (its final name): one call. `mark_group_done` and `bury` delete the entries."""
        if prompt_ids:
            self.client.hset(self.keys.writing, mapping=dict.fromkeys(prompt_ids, shard))

    def unwritten(self, prompt_ids: list[str], shard: str) -> int:
        """The write to `shard` did not happen (or the shard does not hold them): drop each
        entry that still names it (another write may have named another since)."""
        if not prompt_ids:
            return 0
        return int(self.call(lua.UNWRITTEN, [], {"shard": shard}, [(pid,) for pid in prompt_ids]))

    def intake(self, prompt_id: str, worker: str | None = None, most: int = 0,
               pipe: redis.client.Pipeline | None = None) -> "Intake | None":
        """What a delivery needs, in one call: the prompt's packed ids (None once done or
        dead, or forgotten) and, while it has ids, the shard its sample was being written to.
        With `worker`, a prompt to be generated (ids, no writing entry) also has its delivery
        noted in the same call (`workers/intake/deliveries.py`), unless `most` are noted already.
        On `pipe` it is queued (None here; `Intake.read` reads its reply)."""
        head = {"id": prompt_id, "worker": worker or "", "most": most}
        reply = self.call(lua.INTAKE, [self.keys.deliveries], head, pipe=pipe)
        return None if pipe is not None else Intake.read(reply)

    # -- plumbing ---------------------------------------------------------------------------

    def _in_chunks(self, script: Lua, prompt_ids: list[str], records: list[tuple], head: dict | None = None,
                   pipe: redis.client.Pipeline | None = None) -> list:
        """`script` over the prompts, one call per `READ_CHUNK` of them, each prompt's record
        its field followed by its entry of `records`; returns each call's reply (none on `pipe`)."""
        replies = []
        for start in range(0, len(prompt_ids), READ_CHUNK):
            buckets, fields = self.locations(prompt_ids[start:start + READ_CHUNK])
            each = [(f, *record) for f, record in zip(fields, records[start:start + READ_CHUNK])]
            reply = self.call(script, buckets, head, each, pipe)
            if pipe is None:
                replies.append(reply)
        return replies

    def locations(self, prompt_ids: list[str]) -> tuple[list[str], list[bytes]]:
        """Each prompt's bucket key and field (`locate`). (Building all 32,768 bucket names up
        front cost a group commit, which makes a ledger per group, ~10 ms: 2.6% of a busy worker.)"""
        buckets, fields = [], []
        for prompt_id in prompt_ids:
            bucket, f = locate(prompt_id)
            buckets.append(self.keys.state_bucket(bucket))
            fields.append(f)
        return buckets, fields

    def call(self, script: Lua, keys: list[str], head: dict | None = None, each: list = (),
             pipe: redis.client.Pipeline | None = None):
        """Run one of the ledger's scripts (`ledger_scripts.py`, or the conversation ledger's,
        which share its prelude): the run's keys the prelude names, then `keys`."""
        k = self.keys
        own = [k.token_ids, k.dead, k.dead_reasons, k.counters, k.minutes, k.shards, k.writing, k.budgets]
        return script(self.client, own + keys, head, each, pipe)
