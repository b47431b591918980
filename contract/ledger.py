"""Where each prompt of a run stands: the one owner of a run's prompt keys.

The ledger holds, per run, each prompt's state, the token ids of those still
to do, the dead letters, the counts and the per-minute rates (the keys of
`RunKeys` but the spec and the crash counts). Nothing else writes them: every
change of a prompt's state is one Lua script below, so it is atomic (Redis
runs a script alone) and conditional (each looks at the state it finds):

    (none) -> queued   enqueue    a prompt the run does not have yet
    dead   -> queued   requeue    a dead letter replayed; the letter goes
    queued -> done     mark_done  its sample is durable in a shard (mark_stored: a
                                  whole group's, in one call)
    dead   -> done     mark_done  a redelivery succeeded after all; the letter goes
    queued -> dead     bury       its dead letter is stored
    dead   -> dead     bury       a redelivered failure replaces its letter
    done   -> done     claim      export names the canonical shard of a prompt a
                                  version without shard codes stored
    done   -> done     anything   a stored prompt is never dead-lettered, re-queued or counted twice

A conversation's next turn enters the ledger through `conversation_ledger.py`,
whose scripts share this prelude: (none) -> queued (or -> dead, when its
prompt cannot be rendered) in the same atomic step that moves the
conversation past the turn before it.

Any other call is a no-op that returns the state it found, for the caller to
log. The counts by state (`state:queued|done|dead`) and by dead-letter reason
(`reason:CODE`) are kept in the run's counters hash by the same scripts, so
`status` and `dead stats` read them in O(1) and they always add up:
queued + done + dead == enqueued. A dead letter exists exactly while its
prompt is dead (purging one keeps the prompt dead), so `dead list` never
names a stored prompt.

**Writing entries.** While a group's samples are being written, each of its
prompts has an entry naming the shard file (`writing`, `unwritten`); the
transitions to done or dead delete it, so the hash holds only groups in
flight, and an entry a dead worker left tells the prompt's next delivery
where its sample may already be (`intake`; workers/reconcile.py).

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
              canonical copy (0: not known, stored by an older version)

A stored sample belongs to the dataset only while its prompt is done AND it
sits in that shard, so a prompt stored twice counts once, with no set of ids
anywhere (`export`). The same step counts, per shard code, the prompts whose
canonical copy the shard holds (`shards`, a field per shard), so `export`
knows in one read that a shard holds only canonical rows. `<call>` tells `enqueue` that a prompt it finds queued
was queued by an earlier line of the same call (a duplicate in the file), not
by another producer, without a set of the file's ids.

The bucket and field are computed here in Python and passed in, each bucket
as a declared key, so the scripts compute nothing from ids. A run written by
a version that kept one `state` hash keyed by id is read through it, and each
script moves the entries it touches into their buckets.

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

from .clock import CLOCK
from .codec import count_ids
from .keys import STATE_BUCKETS, RunKeys
from .names import PromptState

QUEUED, DONE, DEAD = PromptState.QUEUED, PromptState.DONE, PromptState.DEAD
NEW, AGAIN = "new", "again"  # enqueue outcomes besides the state found
UNKNOWN_SHARD = 0
READ_CHUNK = 1000  # prompts per read script call

# Shared by every script. KEYS: legacy state, ids, dead, counters, minutes, shards, writing, then
# one state bucket per prompt (KEYS[B + i] for the i-th prompt of ARGV).
_READ_PRELUDE = """
local legacy, ids, dead, counters, minutes, shards = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local writing, B = KEYS[7], 7
local has_legacy = redis.call('EXISTS', legacy) == 1
local OLD = {queued = 'q', dead = 'd', done = '0'}
local function kind(v)
  if not v then return nil end
  local c = string.sub(v, 1, 1)
  if c == 'q' then return 'queued' elseif c == 'd' then return 'dead' end
  return 'done'
end
local function peek(bucket, field, id)
  local v = redis.call('HGET', bucket, field)
  if v or not has_legacy then return v end
  local old = redis.call('HGET', legacy, id)
  if not old then return false end
  return OLD[old] or '0'
end
"""

_PRELUDE = _READ_PRELUDE + """
local function get(bucket, field, id)
  local v = peek(bucket, field, id)
  if v and has_legacy and redis.call('HDEL', legacy, id) == 1 then redis.call('HSET', bucket, field, v) end
  return v
end
local function count(name, by)
  if redis.call('HINCRBY', counters, name, by) <= 0 and string.sub(name, 1, 7) == 'reason:' then
    redis.call('HDEL', counters, name)
  end
end
local function forget_letter(id)
  local raw = redis.call('HGET', dead, id)
  if not raw then return 0 end
  local ok, letter = pcall(cjson.decode, raw)
  if ok and type(letter) == 'table' and letter.reason then count('reason:' .. letter.reason, -1) end
  redis.call('HDEL', dead, id)
  return 1
end
local function move(bucket, field, from, to, value)
  redis.call('HSET', bucket, field, value)
  count('state:' .. from, -1)
  count('state:' .. to, 1)
end
"""

# ARGV: the prompts' fields, then (for a run an older version kept) their ids. Returns each
# prompt's raw state (nil: not in the run).
_READ = _READ_PRELUDE + """
local n, out = #KEYS - B, {}
if #ARGV < 2 * n then has_legacy = false end
for i = 1, n do out[i] = peek(KEYS[B + i], ARGV[i], ARGV[n + i]) end
return out
"""

# ARGV: call, then field, id, packed ids, token count per prompt. Returns per prompt
# 'new', 'again' (queued by this same call) or the state found. A run enqueued first
# by a version that keeps state counts is `tallied`.
_ENQUEUE = _PRELUDE + """
if redis.call('HEXISTS', counters, 'enqueued') == 0 then redis.call('HSET', counters, 'tallied', 1) end
local mine = 'q' .. ARGV[1]
local out, fresh, tokens = {}, 0, 0
for i = 1, (#ARGV - 1) / 4 do
  local a, bucket = 4 * i - 2, KEYS[B + i]
  local found = get(bucket, ARGV[a], ARGV[a + 1])
  if not found then
    redis.call('HSET', bucket, ARGV[a], mine)
    redis.call('HSET', ids, ARGV[a + 1], ARGV[a + 2])
    fresh, tokens = fresh + 1, tokens + tonumber(ARGV[a + 3])
    out[i] = 'new'
  elseif found == mine then
    out[i] = 'again'
  else
    out[i] = kind(found)
  end
end
if fresh > 0 then
  count('enqueued', fresh)
  count('state:queued', fresh)
  count('prompt_tokens', tokens)
end
return out
"""

# ARGV: field, id, packed ids per prompt. Returns per prompt 1 (moved) or 0.
_REQUEUE = _PRELUDE + """
local out = {}
for i = 1, #ARGV / 3 do
  local a, bucket = 3 * i - 2, KEYS[B + i]
  out[i] = 0
  if kind(get(bucket, ARGV[a], ARGV[a + 1])) == 'dead' then
    forget_letter(ARGV[a + 1])
    move(bucket, ARGV[a], 'dead', 'queued', 'q')
    redis.call('HSET', ids, ARGV[a + 1], ARGV[a + 2])
    out[i] = 1
  end
end
return out
"""

# ARGV: minute, shard code, then field, id, output tokens per prompt. Returns per prompt the
# state found ('' if none). Every prompt's writing entry goes: a done prompt needs none.
_DONE = _PRELUDE + """
local minute, code, out = ARGV[1], ARGV[2], {}
local moved, tokens = {queued = 0, dead = 0}, 0
for i = 1, (#ARGV - 2) / 3 do
  local a, bucket = 3 * i, KEYS[B + i]
  local field, id = ARGV[a], ARGV[a + 1]
  local found = kind(get(bucket, field, id))
  redis.call('HDEL', writing, id)
  if found == 'queued' or found == 'dead' then
    forget_letter(id)
    redis.call('HSET', bucket, field, code)
    redis.call('HDEL', ids, id)
    moved[found] = moved[found] + 1
    tokens = tokens + tonumber(ARGV[a + 2])
  end
  out[i] = found or ''
end
local stored = moved.queued + moved.dead
if stored > 0 then
  for from, n in pairs(moved) do if n > 0 then count('state:' .. from, -n) end end
  count('state:done', stored)
  if code ~= '0' then redis.call('HINCRBY', shards, code, stored) end
  count('output_tokens', tokens)
  redis.call('HINCRBY', minutes, minute .. ':samples', stored)
  redis.call('HINCRBY', minutes, minute .. ':tokens', tokens)
end
return out
"""

# KEYS[B + 1]: the bucket. ARGV: field, id, reason, letter (JSON with a `reason`), 'forgotten' or ''
_BURY = _PRELUDE + """
local bucket, field, id = KEYS[B + 1], ARGV[1], ARGV[2]
local found = kind(get(bucket, field, id))
if not found and ARGV[5] == 'forgotten' then found = 'queued' end  -- counted queued when enqueued
if found == 'queued' then
  move(bucket, field, 'queued', 'dead', 'd')
  redis.call('HDEL', ids, id)
elseif found == 'dead' then
  forget_letter(id)
else
  return found or ''
end
redis.call('HSET', dead, id, ARGV[4])
redis.call('HDEL', writing, id)
count('reason:' .. ARGV[3], 1)
return found
"""

# ARGV: id, then (optional) the worker taking it and the most deliveries noted here. KEYS[B + 1]:
# the run's deliveries hash (workers/deliveries.py). Returns its packed ids (nil once done or
# dead), its writing entry (which goes if the prompt has no ids: a done prompt's duplicate, whose
# worker died before the write), the deliveries noted before this one, and 1 if this one was
# noted: a prompt with ids and no writing entry has its delivery noted (a line naming the
# worker) unless as many are noted already (the caller's last-chance and poison rules decide those).
_INTAKE = _READ_PRELUDE + """
local raw, shard = redis.call('HGET', ids, ARGV[1]), redis.call('HGET', writing, ARGV[1])
if shard and not raw then redis.call('HDEL', writing, ARGV[1]) shard = false end
local held, noted = false, 0
if raw and not shard and ARGV[2] then
  held = redis.call('HGET', KEYS[B + 1], ARGV[1])
  local count = 0
  if held then for _ in string.gmatch(held, '[^\\n]+') do count = count + 1 end end
  if count < tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[B + 1], ARGV[1], held and (held .. '\\n' .. ARGV[2]) or ARGV[2])
    noted = 1
  end
end
return {raw, shard, held, noted}
"""

# ARGV: shard file name, then ids. Each writing entry that still names that shard goes.
_UNWRITTEN = _READ_PRELUDE + """
local removed = 0
for i = 2, #ARGV do
  if redis.call('HGET', writing, ARGV[i]) == ARGV[1] then removed = removed + redis.call('HDEL', writing, ARGV[i]) end
end
return removed
"""

# ARGV: ids. The prompts stay dead.
_PURGE = _PRELUDE + """
local removed = 0
for i = 1, #ARGV do removed = removed + forget_letter(ARGV[i]) end
return removed
"""

# ARGV: shard code, then field, id per prompt. A done prompt whose canonical shard is
# unknown gets this one. Returns each prompt's raw state afterwards.
_CLAIM = _PRELUDE + """
local out = {}
for i = 1, (#ARGV - 1) / 2 do
  local bucket, field = KEYS[B + i], ARGV[2 * i]
  local v = get(bucket, field, ARGV[2 * i + 1])
  if v == '0' then
    redis.call('HSET', bucket, field, ARGV[1])
    redis.call('HINCRBY', shards, ARGV[1], 1)
    v = ARGV[1]
  end
  out[i] = v
end
return out
"""


class Intake(NamedTuple):
    """A delivery's view of its prompt (`Ledger.intake`)."""
    ids: bytes | None           # packed token ids; None once done or dead, or forgotten
    writing: str | None         # the shard its sample was being written to, while it has ids
    held_by: list[str]          # the workers it was delivered to before (read when noting)
    noted: bool                 # this delivery is noted, naming the worker


def delivery_names(raw: bytes | str | None) -> list[str]:
    """The workers a prompt was delivered to, from its deliveries entry (one name a line)."""
    if not raw:
        return []
    text = raw.decode() if isinstance(raw, bytes) else raw
    return [name for name in text.split("\n") if name]


def locate(prompt_id: str) -> tuple[int, bytes]:
    """A prompt's state bucket (15 bits) and field (64 bits), from BLAKE2b of its id."""
    digest = hashlib.blake2b(prompt_id.encode("utf-8", "surrogatepass"), digest_size=10).digest()
    return int.from_bytes(digest[:2], "big") % STATE_BUCKETS, digest[2:]


def shard_code(shard: str | Path) -> int:
    """The code a done prompt's state holds for the shard of its canonical copy: 4 bytes
    of BLAKE2b of the shard's file name (not its folder, which may move), never 0."""
    digest = hashlib.blake2b(Path(shard).name.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True) or 1


@dataclass(frozen=True)
class Entry:
    """One prompt's state as the ledger holds it."""
    state: str | None = None   # queued | done | dead; None: not in the run
    shard: int | None = None   # done: `shard_code` of its canonical copy's shard (0: not known)
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
    exact: bool = True  # False: a run enqueued by a version that kept no counts by state

    @classmethod
    def from_counters(cls, counters: dict[str, int]) -> "Tally":
        return cls(enqueued=counters.get("enqueued", 0), queued=counters.get("state:queued", 0),
                   done=counters.get("state:done", 0), dead=counters.get("state:dead", 0),
                   reasons={k[7:]: v for k, v in sorted(counters.items()) if k.startswith("reason:") and v > 0},
                   prompt_tokens=counters.get("prompt_tokens", 0), output_tokens=counters.get("output_tokens", 0),
                   exact="tallied" in counters or not counters)

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
        found: list[bytes | None] = []
        legacy = prompt_ids and self.client.exists(self.keys.legacy_state)  # then the ids are needed too
        for start in range(0, len(prompt_ids), READ_CHUNK):
            chunk = prompt_ids[start:start + READ_CHUNK]
            buckets, fields = self._locate(chunk)
            found += self._script(_READ, buckets, fields + chunk if legacy else fields)
        return found

    def states(self, prompt_ids: list[str]) -> list[str | None]:
        return [e.state for e in self.entries(prompt_ids)]

    def state(self, prompt_id: str) -> str | None:
        return self.states([prompt_id])[0]

    def stored(self, prompt_ids: list[str]) -> list[bool]:
        """Whether each prompt's sample belongs to the dataset (its state is done)."""
        return [state == DONE for state in self.states(prompt_ids)]

    def canonical_rows(self, shard: str | Path) -> int:
        """How many prompts name `shard` as the holder of their canonical copy. A shard of
        that many rows holds only canonical rows: each such prompt has a row in it, so its
        rows are those prompts, once each (barring a 2^-32 collision of shard codes)."""
        return int(self.client.hget(self.keys.shards, shard_code(shard)) or 0)

    def pending_ids(self) -> set[str]:
        """Prompts whose ids are still held: queued, in flight, or lost in transit."""
        return {k.decode() for k in self.client.hkeys(self.keys.prompts)}

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
        legacy = {b"queued": b"q", b"dead": b"d", b"done": b"0"}
        for _, raw in self.client.hscan_iter(self.keys.legacy_state, count=1000):
            yield legacy.get(raw, b"0")

    def recent(self, minutes: int = 5) -> tuple[int, int, float]:
        """Samples and output tokens stored in the current minute and the `minutes - 1`
        before it, and the seconds that window spans so far."""
        now = CLOCK.now(self.client)  # minutes are counted on Redis's clock (mark_stored)
        current = int(now // 60)
        fields = [f"{m}:{k}" for m in range(current - minutes + 1, current + 1) for k in ("samples", "tokens")]
        values = [int(v or 0) for v in self.client.hmget(self.keys.minutes, fields)]
        return sum(values[0::2]), sum(values[1::2]), (minutes - 1) * 60 + (now - current * 60)

    # -- transitions ------------------------------------------------------------------------

    def enqueue(self, payloads: dict[str, bytes] | list[tuple[str, bytes]], call: int | str = "",
                pipe: redis.client.Pipeline | None = None):
        """New prompts become queued with their packed ids, by enqueue call `call`. Returns,
        per (id, packed ids) in order, NEW, AGAIN (queued earlier by this same call, in this
        list or before) or the state it found (left as it is). On `pipe`, the pipeline
        returns it raw (`outcomes` reads it)."""
        items = list(payloads.items()) if isinstance(payloads, dict) else list(payloads)
        if not items:
            return []
        buckets, fields = self._locate([pid for pid, _ in items])
        args = [str(call)] + [x for (pid, raw), f in zip(items, fields) for x in (f, pid, raw, count_ids(raw))]
        result = self._script(_ENQUEUE, buckets, args, pipe)
        return result if pipe is not None else self.outcomes(result)

    @staticmethod
    def outcomes(raw: list[bytes]) -> list[str]:
        return [r.decode() for r in raw]

    @staticmethod
    def found(replies: list[list[bytes]]) -> list[str | None]:
        """The states `mark_stored` found, from its calls' replies on a pipeline."""
        return [r.decode() or None for reply in replies for r in reply]

    def requeue(self, payloads: dict[str, bytes], pipe: redis.client.Pipeline | None = None):
        """Dead prompts become queued again with their packed ids, and lose their letters;
        returns the ids that moved (a prompt that is not dead is left as it is)."""
        if not payloads:
            return []
        buckets, fields = self._locate(list(payloads))
        args = [x for (pid, raw), f in zip(payloads.items(), fields) for x in (f, pid, raw)]
        result = self._script(_REQUEUE, buckets, args, pipe)
        return result if pipe is not None else [pid for pid, moved in zip(payloads, result) if moved]

    def mark_done(self, prompt_id: str, output_tokens: int, shard: str | Path | None = None,
                  pipe: redis.client.Pipeline | None = None):
        """The prompt's sample is durable in `shard` (its canonical copy, unless the prompt
        was done already); returns the state it was in (done: nothing changed)."""
        found = self.mark_stored([(prompt_id, output_tokens)], shard, pipe)
        return found[0] if found else None

    def mark_stored(self, samples: list[tuple[str, int]], shard: str | Path | None = None,
                    pipe: redis.client.Pipeline | None = None):
        """A group's samples, (prompt id, output tokens) each, are durable in `shard`: one
        script call per `READ_CHUNK` of them (a group commit's whole ledger step). Returns
        the state each prompt was in, as `mark_done` does; on `pipe`, nothing (the pipeline
        returns each call's list of raw states)."""
        code = shard_code(shard) if shard is not None else UNKNOWN_SHARD
        minute = int(CLOCK.now(self.client) // 60)  # Redis's clock: workers' clocks may disagree
        found: list = []
        for start in range(0, len(samples), READ_CHUNK):
            chunk = samples[start:start + READ_CHUNK]
            buckets, fields = self._locate([pid for pid, _ in chunk])
            args = [minute, code] + [x for (pid, tokens), f in zip(chunk, fields) for x in (f, pid, tokens)]
            result = self._script(_DONE, buckets, args, pipe)
            if pipe is None:
                found += self.found([result])
        return found

    def bury(self, prompt_id: str, reason: str, letter: str, forgotten: bool = False) -> str | None:
        """Store the prompt's dead letter; returns the state it was in. Only a queued or dead
        prompt gets a letter: a done one (or one the run does not have) is left as it is, unless
        `forgotten`: a prompt whose message is queued but whose ledger entries Redis lost (evicted,
        flushed) is buried as the queued prompt it was."""
        buckets, fields = self._locate([prompt_id])
        args = [fields[0], prompt_id, str(reason), letter, "forgotten" if forgotten else ""]
        return self._script(_BURY, buckets, args).decode() or None

    def purge(self, prompt_ids: list[str]) -> int:
        """Delete dead letters; their prompts stay dead. Returns how many were deleted."""
        return int(self._script(_PURGE, [], list(prompt_ids))) if prompt_ids else 0

    def claim(self, prompt_ids: list[str], shard: str | Path) -> list[Entry]:
        """Done prompts whose canonical shard is not known (stored by a version that kept
        none) get `shard`; returns each prompt's entry afterwards."""
        found: list[Entry] = []
        for start in range(0, len(prompt_ids), READ_CHUNK):
            chunk = prompt_ids[start:start + READ_CHUNK]
            buckets, fields = self._locate(chunk)
            args = [shard_code(shard)] + [x for pair in zip(fields, chunk) for x in pair]
            found += [Entry.decode(r) for r in self._script(_CLAIM, buckets, args)]
        return found

    # -- writing entries: a group commit's samples, from just before the write until done --

    def writing(self, prompt_ids: list[str], shard: str) -> None:
        """These prompts' samples are about to be written to the shard file named `shard`
        (its final name): one call. `mark_stored` and `bury` delete the entries."""
        if prompt_ids:
            self.client.hset(self.keys.writing, mapping=dict.fromkeys(prompt_ids, shard))

    def unwritten(self, prompt_ids: list[str], shard: str) -> int:
        """The write to `shard` did not happen (or the shard does not hold them): drop each
        entry that still names it (another write may have named another since)."""
        return int(self._script(_UNWRITTEN, [], [shard, *prompt_ids])) if prompt_ids else 0

    def intake(self, prompt_id: str, worker: str | None = None, most: int = 0) -> "Intake":
        """What a delivery needs, in one call: the prompt's packed ids (None once done or
        dead, or forgotten) and, while it has ids, the shard its sample was being written to.
        With `worker`, a prompt to be generated (ids, no writing entry) also has its delivery
        noted in the same call (`workers/deliveries.py`), unless `most` are noted already."""
        args = [prompt_id] if worker is None else [prompt_id, worker, most]
        raw, shard, held, noted = self._script(_INTAKE, [self.keys.deliveries], args)
        return Intake(raw, shard.decode() if shard is not None else None, delivery_names(held), bool(noted))

    # -- plumbing ---------------------------------------------------------------------------

    def _locate(self, prompt_ids: list[str]) -> tuple[list[str], list[bytes]]:
        """Each prompt's bucket key and field. (Building all 32,768 bucket names up front cost a
        group commit, which makes a ledger per group, ~10 ms: 2.6% of a busy worker.)"""
        buckets, fields = [], []
        for prompt_id in prompt_ids:
            bucket, f = locate(prompt_id)
            buckets.append(self.keys.state_bucket(bucket))
            fields.append(f)
        return buckets, fields

    def _script(self, source: str, buckets: list[str], args: list,
                pipe: redis.client.Pipeline | None = None):
        keys = [self.keys.legacy_state, self.keys.prompts, self.keys.dead, self.keys.counters,
                self.keys.minutes, self.keys.shards, self.keys.writing, *buckets]
        script = _SCRIPTS.get(source) or _SCRIPTS.setdefault(source, self.client.register_script(source))
        return script(keys=keys, args=args, client=self.client if pipe is None else pipe)


# One Script object per source (its SHA computed once), called with the caller's client, so
# a pipeline of many transitions loads each script once.
_SCRIPTS: dict[str, "redis.commands.core.Script"] = {}
