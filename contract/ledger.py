"""Where each prompt of a run stands: the one owner of a run's prompt keys.

The ledger holds, per run, each prompt's state, the token ids of those still
to do, the dead letters, the counts and the per-minute rates (the keys of
`RunKeys` but the spec and the crash counts). Nothing else writes them: every
change of a prompt's state is one Lua script below, so it is atomic (Redis
runs a script alone) and conditional (each looks at the state it finds):

    (none) -> queued   enqueue    a prompt the run does not have yet
    dead   -> queued   requeue    a dead letter replayed; the letter goes
    queued -> done     mark_done  its sample is durable in a shard
    dead   -> done     mark_done  a redelivery succeeded after all; the letter goes
    queued -> dead     bury       its dead letter is stored
    dead   -> dead     bury       a redelivered failure replaces its letter
    done   -> done     anything   a stored prompt is never dead-lettered, re-queued or counted twice

Any other call is a no-op that returns the state it found, for the caller to
log. The counts by state (`state:queued|done|dead`) and by dead-letter reason
(`reason:CODE`) are kept in the run's counters hash by the same scripts, so
`status` and `dead stats` read them in O(1) and they always add up:
queued + done + dead == enqueued. A dead letter exists exactly while its
prompt is dead (purging one keeps the prompt dead), so `dead list` never
names a stored prompt, and a shard row belongs to the dataset only while the
ledger says its prompt is done (`stored`).

The producer writes a prompt's token ids and marks it queued before it
publishes the message (so a crash in between leaves a prompt the audit can
republish, never one that is lost). A re-run of `enqueue` skips every prompt
the ledger already has.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import redis

from .codec import count_ids
from .keys import RunKeys
from .names import PromptState

QUEUED, DONE, DEAD = PromptState.QUEUED, PromptState.DONE, PromptState.DEAD

# Shared by every script. KEYS: state, ids, dead, counters, minutes (always in this order).
_PRELUDE = """
local state, ids, dead, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
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
local function move(id, from, to)
  redis.call('HSET', state, id, to)
  count('state:' .. from, -1)
  count('state:' .. to, 1)
end
"""

# ARGV: id, packed ids, token count, ... A run enqueued first by this version is `tallied`.
_ENQUEUE = _PRELUDE + """
if redis.call('HEXISTS', counters, 'enqueued') == 0 then redis.call('HSET', counters, 'tallied', 1) end
local fresh, tokens = 0, 0
for i = 1, #ARGV, 3 do
  if redis.call('HSETNX', state, ARGV[i], 'queued') == 1 then
    redis.call('HSET', ids, ARGV[i], ARGV[i + 1])
    fresh, tokens = fresh + 1, tokens + tonumber(ARGV[i + 2])
  end
end
if fresh > 0 then
  count('enqueued', fresh)
  count('state:queued', fresh)
  count('prompt_tokens', tokens)
end
return fresh
"""

# ARGV: id, packed ids, ...
_REQUEUE = _PRELUDE + """
local moved = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', state, ARGV[i]) == 'dead' then
    forget_letter(ARGV[i])
    move(ARGV[i], 'dead', 'queued')
    redis.call('HSET', ids, ARGV[i], ARGV[i + 1])
    moved = moved + 1
  end
end
return moved
"""

# ARGV: id, output tokens, minute
_DONE = _PRELUDE + """
local id, tokens = ARGV[1], tonumber(ARGV[2])
local found = redis.call('HGET', state, id)
if found ~= 'queued' and found ~= 'dead' then return found or '' end
forget_letter(id)
move(id, found, 'done')
redis.call('HDEL', ids, id)
count('output_tokens', tokens)
redis.call('HINCRBY', KEYS[5], ARGV[3] .. ':samples', 1)
redis.call('HINCRBY', KEYS[5], ARGV[3] .. ':tokens', tokens)
return found
"""

# ARGV: id, reason, letter (JSON with a `reason`)
_BURY = _PRELUDE + """
local id = ARGV[1]
local found = redis.call('HGET', state, id)
if not found and ARGV[4] == 'forgotten' then found = 'queued' end  -- counted queued when enqueued
if found == 'queued' then
  move(id, 'queued', 'dead')
  redis.call('HDEL', ids, id)
elseif found == 'dead' then
  forget_letter(id)
else
  return found or ''
end
redis.call('HSET', dead, id, ARGV[3])
count('reason:' .. ARGV[2], 1)
return found
"""

# ARGV: ids. The prompts stay dead.
_PURGE = _PRELUDE + """
local removed = 0
for i = 1, #ARGV do removed = removed + forget_letter(ARGV[i]) end
return removed
"""


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


class Ledger:
    def __init__(self, client: redis.Redis, run: str):
        self.client, self.run, self.keys = client, run, RunKeys(run)

    # -- reads ------------------------------------------------------------------------------

    def state(self, prompt_id: str) -> str | None:
        raw = self.client.hget(self.keys.state, prompt_id)
        return raw.decode() if raw else None

    def states(self, prompt_ids: list[str]) -> list[str | None]:
        if not prompt_ids:
            return []
        return [r.decode() if r else None for r in self.client.hmget(self.keys.state, prompt_ids)]

    def stored(self, prompt_ids: list[str]) -> list[bool]:
        """Whether each prompt's sample belongs to the dataset (its state is done)."""
        return [state == DONE for state in self.states(prompt_ids)]

    def payload(self, prompt_id: str) -> bytes | None:
        return self.client.hget(self.keys.prompts, prompt_id)

    def pending_ids(self) -> set[str]:
        """Prompts whose ids are still held: queued, in flight, or lost in transit."""
        return {k.decode() for k in self.client.hkeys(self.keys.prompts)}

    def letter(self, prompt_id: str) -> bytes | None:
        """A dead prompt's dead letter (JSON), while it has one."""
        return self.client.hget(self.keys.dead, prompt_id)

    def letters(self) -> Iterator[bytes]:
        for _, raw in self.client.hscan_iter(self.keys.dead, count=500):
            yield raw

    def tally(self) -> Tally:
        return Tally.from_counters(self.counters())

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.keys.counters).items()}

    def counts(self) -> dict[str, int]:
        """Prompts by state, counted from the ledger's own entries: a slow check of `tally`."""
        counts: dict[str, int] = {}
        for _, raw in self.client.hscan_iter(self.keys.state, count=1000):
            state = raw.decode()
            counts[state] = counts.get(state, 0) + 1
        return counts

    def recent(self, minutes: int = 5) -> tuple[int, int, float]:
        """Samples and output tokens stored in the current minute and the `minutes - 1`
        before it, and the seconds that window spans so far."""
        now = time.time()
        current = int(now // 60)
        fields = [f"{m}:{k}" for m in range(current - minutes + 1, current + 1) for k in ("samples", "tokens")]
        values = [int(v or 0) for v in self.client.hmget(self.keys.minutes, fields)]
        return sum(values[0::2]), sum(values[1::2]), (minutes - 1) * 60 + (now - current * 60)

    # -- transitions ------------------------------------------------------------------------

    def enqueue(self, payloads: dict[str, bytes], pipe: redis.client.Pipeline | None = None):
        """New prompts become queued with their packed ids; returns how many were new
        (a prompt the run already has is left as it is). On `pipe`, the pipeline returns it."""
        args = [x for pid, raw in payloads.items() for x in (pid, raw, count_ids(raw))]
        return self._script(_ENQUEUE, args, pipe) if payloads else 0

    def requeue(self, payloads: dict[str, bytes], pipe: redis.client.Pipeline | None = None):
        """Dead prompts become queued again with their packed ids, and lose their letters;
        returns how many moved (a prompt that is not dead is left as it is)."""
        args = [x for pid, raw in payloads.items() for x in (pid, raw)]
        return self._script(_REQUEUE, args, pipe) if payloads else 0

    def mark_queued(self, pipe: redis.client.Pipeline, payloads: dict[str, bytes], tokens: int,
                    count_as_new: bool = True) -> None:
        """`enqueue` (new prompts) or `requeue` (dead letters replayed) on a pipeline. `tokens`
        is ignored: each prompt's count is read from its packed ids, and only new ones count."""
        (self.enqueue if count_as_new else self.requeue)(payloads, pipe)

    def mark_done(self, prompt_id: str, output_tokens: int) -> str | None:
        """The prompt's sample is durable; returns the state it was in (done: nothing changed)."""
        found = self._script(_DONE, [prompt_id, output_tokens, int(time.time() // 60)])
        return found.decode() or None

    def bury(self, prompt_id: str, reason: str, letter: str, forgotten: bool = False) -> str | None:
        """Store the prompt's dead letter; returns the state it was in. Only a queued or dead
        prompt gets a letter: a done one (or one the run does not have) is left as it is, unless
        `forgotten`: a prompt whose message is queued but whose ledger entries Redis lost (evicted,
        flushed) is buried as the queued prompt it was."""
        args = [prompt_id, str(reason), letter, "forgotten" if forgotten else ""]
        return self._script(_BURY, args).decode() or None

    def purge(self, prompt_ids: list[str]) -> int:
        """Delete dead letters; their prompts stay dead. Returns how many were deleted."""
        return int(self._script(_PURGE, list(prompt_ids))) if prompt_ids else 0

    def _script(self, source: str, args: list, pipe: redis.client.Pipeline | None = None):
        keys = [self.keys.state, self.keys.prompts, self.keys.dead, self.keys.counters, self.keys.minutes]
        return self.client.register_script(source)(keys=keys, args=args, client=pipe)
