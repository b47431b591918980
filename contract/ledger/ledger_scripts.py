"""The ledger's Lua: each transition of a prompt (`ledger.py`'s table) is one script here.

Every script starts with `PRELUDE`: the run's keys by name, then the
functions that say each step once, so that a rule shared by two transitions
(queueing a prompt, burying one, forgetting a letter, keeping the counts) has
one home, here, also for the conversation ledger's scripts, which share it:

    queue(p, value, from)           -> queued, with its ids: a new prompt (from nil,
                                       counted as enqueued) or a dead one replayed
                                       (with the budget its message carries, `budgets`)
    bury(p, from, reason, letter)   -> dead, with its letter: a queued, dead or new prompt
    forget_letter(id)               a dead prompt's letter goes, and its reason's count

A letter's reason is kept beside it (`RunKeys.dead_reasons`), so that
forgetting a letter costs two small hash reads, never decoding the letter
(its prompt ids and traceback) on Redis's one thread.

`p` is a prompt's record: its bucket key (`p.key`), its field there
(`p.field`), its id and, when queued, its packed ids and token count. Counts
are added up while a script runs (`add`) and written once when it ends
(`flush`), one HINCRBY per counter and not per prompt.
"""
from __future__ import annotations

from contract.ledger.deliveries import LUA as DELIVERIES
from contract.redis_link.scripts import Lua

# KEYS of every ledger script: these eight (as `Ledger.call` passes them), then one state
# bucket per prompt (KEYS[B + i], the i-th record's `key`).
PRELUDE = """
local ids, dead, reasons, counters, minutes, shards = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local writing, budgets, B = KEYS[7], KEYS[8], 8
local function kind(v)
  if not v then return nil end
  local c = string.sub(v, 1, 1)
  if c == 'q' then return 'queued' elseif c == 'd' then return 'dead' end
  return 'done'
end
local function state(p) return redis.call('HGET', p.key, p.field) end
local changes = {}
local function add(name, by) changes[name] = (changes[name] or 0) + by end
local function flush()
  for name, by in pairs(changes) do
    if by ~= 0 and redis.call('HINCRBY', counters, name, by) <= 0 and string.sub(name, 1, 7) == 'reason:' then
      redis.call('HDEL', counters, name)
    end
  end
end
local function forget_letter(id)
  local reason = redis.call('HGET', reasons, id)
  if reason then
    add('reason:' .. reason, -1)
    redis.call('HDEL', reasons, id)
  end
  return redis.call('HDEL', dead, id)
end
local function queue(p, value, from)
  redis.call('HSET', p.key, p.field, value)
  redis.call('HSET', ids, p.id, p.ids)
  if p.budget and p.budget ~= '' then
    redis.call('HSET', budgets, p.id, p.budget)
  elseif from then
    redis.call('HDEL', budgets, p.id)
  end
  add('state:queued', 1)
  if from then
    add('state:' .. from, -1)
  else
    add('enqueued', 1)
    add('prompt_tokens', tonumber(p.tokens))
  end
end
local function bury(p, from, reason, letter)
  if from == 'dead' then forget_letter(p.id) else redis.call('HDEL', ids, p.id) end
  redis.call('HDEL', budgets, p.id)
  if from then add('state:' .. from, -1) else add('enqueued', 1) end
  redis.call('HSET', p.key, p.field, 'd')
  redis.call('HSET', dead, p.id, letter)
  redis.call('HSET', reasons, p.id, reason)
  redis.call('HDEL', writing, p.id)
  add('state:dead', 1)
  add('reason:' .. reason, 1)
end
"""

# Each prompt's raw state (false: not in the run).
READ = Lua("""
local out = {}
for i, p in ipairs(prompts) do out[i] = state(p) end
return out
""", prelude=PRELUDE, each=("field",), key_offset="B")

# Per prompt 'new', 'again' (queued by this same call) or the state found. A record whose `first`
# is '1' (sample 0 of a prompt in a run of several samples a prompt) also counts a prompt when new.
ENQUEUE = Lua("""
local mine, out = 'q' .. a.call, {}
for i, p in ipairs(prompts) do
  local found = state(p)
  if not found then
    queue(p, mine, nil)
    if p.first == '1' then add('prompts', 1) end
    out[i] = 'new'
  elseif found == mine then
    out[i] = 'again'
  else
    out[i] = kind(found)
  end
end
flush()
return out
""", prelude=PRELUDE, head=("call",), each=("field", "id", "ids", "tokens", "first"), key_offset="B")

# Per prompt 1 (dead, now queued; its letter gone) or 0 (left as it was).
REQUEUE = Lua("""
local out = {}
for i, p in ipairs(prompts) do
  out[i] = 0
  if kind(state(p)) == 'dead' then
    forget_letter(p.id)
    queue(p, 'q', 'dead')
    out[i] = 1
  end
end
flush()
return out
""", prelude=PRELUDE, each=("field", "id", "ids", "budget"), key_offset="B")

# Per prompt the state found ('' if none). Every prompt's writing entry goes: a done prompt needs
# none. The entries and the stored prompts' ids go in one HDEL each, not one per prompt. A sample's
# verdict class (pass, fail or error; '' without a verifier: contract/run/verifiers.py) is counted
# (`verdict:<class>`) in the same step that makes it done, so a sample counts once, however often
# its group is marked.
DONE = Lua("""
local out, stored, tokens, every, gone = {}, 0, 0, {}, {}
for i, p in ipairs(prompts) do
  local found = kind(state(p))
  every[i] = p.id
  if found == 'queued' or found == 'dead' then
    if found == 'dead' then forget_letter(p.id) end
    redis.call('HSET', p.key, p.field, a.code)
    gone[#gone + 1] = p.id
    add('state:' .. found, -1)
    stored, tokens = stored + 1, tokens + tonumber(p.tokens)
    if p.verdict ~= '' then add('verdict:' .. p.verdict, 1) end
  end
  out[i] = found or ''
end
if #every > 0 then redis.call('HDEL', writing, unpack(every)) end
if stored > 0 then
  redis.call('HDEL', ids, unpack(gone))
  redis.call('HDEL', budgets, unpack(gone))
  add('state:done', stored)
  add('output_tokens', tokens)
  redis.call('HINCRBY', shards, a.code, stored)
  redis.call('HINCRBY', minutes, a.minute .. ':samples', stored)
  redis.call('HINCRBY', minutes, a.minute .. ':tokens', tokens)
end
flush()
return out
""", prelude=PRELUDE, head=("minute", "code"), each=("field", "id", "tokens", "verdict"), key_offset="B")

# KEYS[B + 1]: the prompt's bucket. The state found ('' if none); only a queued or dead prompt
# gets the letter, or (`forgotten`) one whose entries Redis lost, counted queued when enqueued.
BURY = Lua("""
local p = {key = KEYS[B + 1], field = a.field, id = a.id}
local found = kind(state(p))
if not found and a.forgotten == 'forgotten' then found = 'queued' end
if found ~= 'queued' and found ~= 'dead' then return found or '' end
bury(p, found, a.reason, a.letter)
flush()
return found
""", prelude=PRELUDE, head=("field", "id", "reason", "letter", "forgotten"))

# KEYS[B + 1]: the run's deliveries hash (contract/ledger/deliveries.py). Returns the prompt's packed ids
# (false once done or dead), its writing entry (which goes if the prompt has no ids: a done
# prompt's duplicate, whose worker died before the write), its deliveries entry as it was, 1
# if this delivery was noted, and the budget a requeue gave it (false: none): a prompt with ids
# and no writing entry has its delivery to `a.worker` noted unless `a.most` are noted already
# (the caller's last-chance and poison rules decide those).
INTAKE = Lua("""
local raw, shard = redis.call('HGET', ids, a.id), redis.call('HGET', writing, a.id)
if shard and not raw then redis.call('HDEL', writing, a.id) shard = false end
local held, noted = false, 0
if raw and not shard and a.worker ~= '' then
  held = redis.call('HGET', KEYS[B + 1], a.id)
  if #delivered(held) < tonumber(a.most) then
    deliver(KEYS[B + 1], a.id, held, a.worker)
    noted = 1
  end
end
local budget = raw and redis.call('HGET', budgets, a.id)
return {raw, shard, held, noted, budget}
""", prelude=PRELUDE + DELIVERIES, head=("id", "worker", "most"))

# Each writing entry that still names `a.shard` goes; returns how many.
UNWRITTEN = Lua("""
local removed = 0
for _, p in ipairs(prompts) do
  if redis.call('HGET', writing, p.id) == a.shard then removed = removed + redis.call('HDEL', writing, p.id) end
end
return removed
""", prelude=PRELUDE, head=("shard",), each=("id",))

# The prompts' letters go; the prompts stay dead. Returns how many went.
PURGE = Lua("""
local removed = 0
for _, p in ipairs(prompts) do removed = removed + forget_letter(p.id) end
flush()
return removed
""", prelude=PRELUDE, each=("id",))
