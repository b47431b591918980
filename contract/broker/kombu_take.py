"""kombu's take and acknowledgement in a few Redis commands per round trip, not nine per message.

kombu's Redis transport takes one message per BRPOP, records it as
unacknowledged in a MULTI/ZADD/HSET/EXEC transaction (`QoS.append`: the whole
message sent back to Redis), and acknowledges it with another (ZREM + HDEL):
ten commands and three round trips per message, the larger half of a sample's
Redis cost. The fleet keeps kombu's keys, values and rules (a delivery is
the `unacked` hash's entry `[message, exchange, routing key]` under its tag,
and its lease the tag's score in `unacked_index`; `kombu_redis` says where
they were read) and changes only how many commands carry them:

- **take**: once BRPOP has taken a message, one script (`TAKE`) records it
  and takes up to `most` more from the same lists, in the order BRPOP was
  given them (priority, then queue), recording each in the same atomic step:
  a message taken by the script is never off its queue without being
  unacknowledged, and its body never crosses the network back to Redis.
  Each is scored with the taking worker's lease holder, not the time
  (`worker_lease` says why), and the holder's lease is renewed in the same
  step, so a delivery never names a holder without a lease.
  `most` is what the channel's prefetch count still allows
  (`QoS.can_consume_max_estimate`), at most `MOST_PER_TAKE`, so one script
  stays short on Redis's one thread. A message the script cannot read as a
  kombu message (no delivery tag or delivery info) is returned unrecorded,
  for kombu's own path to record or refuse, as it would have.
- **acknowledge**: a group commit acknowledges its samples' deliveries in the
  same round trip that marks them done (`forget` on its pipeline, after the
  done marks: acknowledged only once durable and done), and kombu's own ack of
  such a tag later only settles the channel's memory (`kombu_redis.settled`).

A take whose reply is lost (the connection cut after Redis ran the script) strands nothing:
each take carries a token, and the script records, per holder and taking thread, the last take's
token and what it recorded (`TAKE_PREFIX`); the same take run again (redis-py's one fail-fast retry, or the
worker's next channel after a reconnect: `workers/intake/transport.py`) takes nothing more and
returns what the first run recorded.

The worker's kombu transport (`workers/intake/transport.py`) calls both.
"""
from __future__ import annotations

import secrets
from typing import NamedTuple

from kombu.utils.json import dumps, loads

from contract.keys import LEASES, TAKE_PREFIX
from contract.broker.kombu_redis import UNACKED, UNACKED_INDEX
from contract.redis_link.scripts import Lua
from contract.broker.worker_lease import Holder

MOST_PER_TAKE = 100  # messages one TAKE may take besides BRPOP's (~1 ms of Redis at most)
RECORD_SECONDS = 3600  # a holder's last take stays readable this long (a reconnect replays it well before)

# KEYS: the unacked hash, its index, the leases, the holder's take records, then the lists in BRPOP's
# order. ARGV: the holder and its score, the most to take, the message BRPOP took (its tag and unacked
# entry; '' when none), the take's token ('' for none: no record) and its lane (the taking thread:
# a process's threads take side by side, each its own record). The lease is scored on Redis's own
# clock (TIME). Returns, per message, its list, the message, and how to read it: 1 recorded, 0 not
# recorded (kombu's path judges it), 2 an unacked entry `[message, exchange, routing key]` (a replay),
# 3 BRPOP's message, recorded (first, under the list '', its body not sent back).
# A take whose token is the one recorded for its holder and lane already ran (its reply was lost): it takes
# nothing more and returns what that take recorded that is still unacknowledged, BRPOP's message
# among them under the list '' (one acknowledged or restored since is left out), each re-scored
# under the holder's lease.
TAKE = Lua("""
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if a.token ~= '' then
  local last = redis.call('HGET', KEYS[4], a.lane)
  if last then
    local done = cjson.decode(last)
    if done[1] == a.token then
      local out, scores = {}, {}
      for _, item in ipairs(done[2]) do
        if item[3] == 1 then
          local entry = redis.call('HGET', KEYS[1], item[2])
          if entry then
            out[#out + 1] = {item[1], entry, 2}
            scores[#scores + 1] = a.score
            scores[#scores + 1] = item[2]
          end
        else
          out[#out + 1] = {item[1], item[2], 0}
        end
      end
      redis.call('ZADD', KEYS[3], now, a.holder)
      if #scores > 0 then redis.call('ZADD', KEYS[2], 'XX', unpack(scores)) end
      return out
    end
  end
end
local scores, entries, out, done = {}, {}, {}, {}
local function record(tag, entry)
  scores[#scores + 1] = a.score
  scores[#scores + 1] = tag
  entries[#entries + 1] = tag
  entries[#entries + 1] = entry
end
if a.tag ~= '' then
  record(a.tag, a.entry)
  done[#done + 1] = {'', a.tag, 1}
  out[1] = {'', '', 3}
end
local left = tonumber(a.most)
for i = 5, #KEYS do
  if left <= 0 then break end
  local taken = redis.call('RPOP', KEYS[i], left)
  if taken then
    for _, raw in ipairs(taken) do
      local ok, m = pcall(cjson.decode, raw)
      local p = ok and type(m) == 'table' and m.properties
      local info = type(p) == 'table' and p.delivery_info
      local readable = type(info) == 'table' and type(p.delivery_tag) == 'string'
        and type(info.exchange) == 'string' and type(info.routing_key) == 'string'
      if readable then
        record(p.delivery_tag, '[' .. raw .. ',' .. cjson.encode(info.exchange) .. ',' .. cjson.encode(info.routing_key) .. ']')
        done[#done + 1] = {KEYS[i], p.delivery_tag, 1}
      else
        done[#done + 1] = {KEYS[i], raw, 0}
      end
      out[#out + 1] = {KEYS[i], raw, readable and 1 or 0}
    end
    left = left - #taken
  end
end
if #scores > 0 then
  redis.call('ZADD', KEYS[3], now, a.holder)
  redis.call('ZADD', KEYS[2], unpack(scores))
  redis.call('HSET', KEYS[1], unpack(entries))
end
if a.token ~= '' then
  redis.call('HSET', KEYS[4], a.lane, cjson.encode({a.token, done}))
  redis.call('EXPIRE', KEYS[4], a.keep)
end
return out
""", head=("holder", "score", "most", "tag", "entry", "token", "lane", "keep"))


class Taken(NamedTuple):
    """A message the script took: the list it came from, the message, whether it is recorded.
    A replay returns BRPOP's own message too, under the list ''."""
    source: str
    payload: dict
    recorded: bool


def unacked_entry(payload: dict) -> str:
    """The `unacked` hash's value for a message, as kombu's `QoS.append` writes it (kombu's JSON,
    which also carries the types its own `loads` made of the message)."""
    info = payload["properties"]["delivery_info"]
    return dumps([payload, info["exchange"], info["routing_key"]])


def take(client, lists: list[str], first: dict | None, most: int, holder: Holder,
         token: str = "", entry: str | None = None, lane: str = "") -> list[Taken]:
    """Record `first` (the message BRPOP took, if any) as unacknowledged under `holder`'s lease,
    and take up to `most` more from `lists` (BRPOP's order), each recorded in the same script;
    returns them in order, `first` at the head under the list ''. With a `token` (`new_token()`),
    the take is idempotent within its `lane` (the taking thread; a lane's new take replaces its
    record): run again with the same token (its reply was lost), it takes nothing more and
    returns what it recorded, leaving out what was acknowledged or restored since. `entry`: the
    unacked entry to record for `first` (kombu's own `[raw, exchange, routing key]`), else built
    from it."""
    head = {"holder": holder.name, "score": repr(holder.score), "most": max(0, min(most, MOST_PER_TAKE)),
            "tag": "", "entry": "", "token": token, "lane": lane, "keep": RECORD_SECONDS}
    if first is not None:
        head.update(tag=first["properties"]["delivery_tag"], entry=entry or unacked_entry(first))
    reply = TAKE(client, [UNACKED, UNACKED_INDEX, LEASES, TAKE_PREFIX + holder.name, *lists], head)
    return [_taken(source, raw, kind, first) for source, raw, kind in reply]


def _taken(source: bytes, raw: bytes, kind: int, first: dict | None) -> Taken:
    if kind == 3:
        return Taken("", first, True)
    found = loads(raw.decode())
    return Taken(source.decode(), found[0] if kind == 2 else found, bool(kind))


def record(client, tag: str, entry: str, holder: Holder) -> None:
    """Record one delivery as unacknowledged under `holder`'s lease (a message the take could not
    read, which kombu's path delivered): the take's script, taking nothing more."""
    TAKE(client, [UNACKED, UNACKED_INDEX, LEASES, TAKE_PREFIX + holder.name],
         {"holder": holder.name, "score": repr(holder.score), "most": 0, "tag": tag, "entry": entry,
          "token": "", "lane": "", "keep": RECORD_SECONDS})


def new_token() -> str:
    """A take's token: unique within its holder's takes."""
    return secrets.token_hex(8)


def forget(pipe, tags: list[str]) -> None:
    """Acknowledge deliveries by tag on a caller's pipeline (kombu's `_remove_from_indices`)."""
    if tags:
        pipe.zrem(UNACKED_INDEX, *tags)
        pipe.hdel(UNACKED, *tags)


def readable(payload) -> bool:
    """Whether a message is one `take` can record (kombu's append needs its tag and delivery info)."""
    try:
        info = payload["properties"]["delivery_info"]
        return all(isinstance(v, str) for v in (payload["properties"]["delivery_tag"], info["exchange"],
                                                info["routing_key"]))
    except (KeyError, TypeError):
        return False
